"""Which factors do the failing cells share? (pure)

Finds the smallest conjunction of conditions (`axis = value` or `axis in {values}`) that covers
every failing cell and no passing cell. Cells with other statuses (error, skipped, ...) are
neither: a condition may cover them or not. When no exact explanation exists, the best cover
(most failures covered, then fewest passes) is returned with its counts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

MAX_LITERALS = 4
MAX_SUBSET_VALUES = 8  # axes with more values only get single-value conditions


@dataclass(frozen=True)
class Literal:
    factor: str
    values: frozenset[str]

    def holds(self, cell: dict[str, str]) -> bool:
        return cell.get(self.factor) in self.values

    def __str__(self) -> str:
        if len(self.values) == 1:
            return f"{self.factor}={next(iter(self.values))}"
        return f"{self.factor} in {{{', '.join(sorted(self.values))}}}"


@dataclass(frozen=True)
class Explanation:
    literals: tuple[Literal, ...]
    failing_covered: int
    failing_total: int
    passing_covered: int
    exact: bool

    def __str__(self) -> str:
        if not self.literals:
            return "no passing cell to contrast with" if self.exact else "no shared condition"
        text = " & ".join(str(lit) for lit in self.literals)
        if self.exact:
            return text
        return (f"{text} (covers {self.failing_covered} of {self.failing_total} failing cells "
                f"and {self.passing_covered} passing)")


def _candidates(cells: list[dict[str, str]]) -> list[Literal]:
    factors: dict[str, list[str]] = {}
    for cell in cells:
        for factor, value in cell.items():
            factors.setdefault(factor, [])
            if value not in factors[factor]:
                factors[factor].append(value)
    literals = []
    for factor, values in factors.items():
        if len(values) < 2:
            continue
        sizes = range(1, len(values)) if len(values) <= MAX_SUBSET_VALUES else range(1, 2)
        for size in sizes:
            for subset in itertools.combinations(values, size):
                literals.append(Literal(factor, frozenset(subset)))
    return literals


def explain(failing: list[dict[str, str]], passing: list[dict[str, str]]) -> Explanation | None:
    """The smallest exact explanation of `failing` against `passing`, else the best cover."""
    if not failing:
        return None
    if not passing:
        return Explanation((), len(failing), len(failing), 0, True)
    literals = [lit for lit in _candidates(failing + passing) if all(lit.holds(c) for c in failing)]
    # Only literals true on every failing cell can be part of an exact conjunction.
    for size in range(1, MAX_LITERALS + 1):
        exact = []
        for combo in itertools.combinations(literals, size):
            if len({lit.factor for lit in combo}) < size:
                continue
            if not any(all(lit.holds(c) for lit in combo) for c in passing):
                exact.append(combo)
        if exact:
            # Prefer conditions that name fewer values (the most specific reading of the data).
            best = min(exact, key=lambda combo: (sum(len(lit.values) for lit in combo),
                                                 [str(lit) for lit in combo]))
            ordered = tuple(sorted(best, key=lambda lit: (lit.factor != "model", str(lit))))
            return Explanation(ordered, len(failing), len(failing), 0, True)
    return _best_cover(failing, passing)


def _best_cover(failing: list[dict[str, str]], passing: list[dict[str, str]]) -> Explanation:
    best: tuple[int, int, tuple[Literal, ...]] = (0, 0, ())
    literals = _candidates(failing + passing)
    for size in range(1, 3):
        for combo in itertools.combinations(literals, size):
            if len({lit.factor for lit in combo}) < size:
                continue
            covered = sum(all(lit.holds(c) for lit in combo) for c in failing)
            wrongly = sum(all(lit.holds(c) for lit in combo) for c in passing)
            if (covered - wrongly, -wrongly) > (best[0] - best[1], -best[1]):
                best = (covered, wrongly, combo)
    return Explanation(best[2], best[0], len(failing), best[1], False)
