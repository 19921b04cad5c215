"""Stopping a clearly broken cell early, with a bounded false-stop rate (pure).

While a cell runs (its questions in seeded random order), the answers so far are tested against the
model's floor at fixed looks (20, 40, 80, ... questions). Each look spends alpha / looks (a Bonferroni
split across looks), so the chance that a healthy cell is ever stopped is at most `alpha` however many
looks happen: the test is valid at any look, not only at the end. A cell at 0.15 with a floor of
0.85 stops at the first look; a healthy cell runs to its configured size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from harness.gate.stats import below_floor_p
from harness.results.records import QuestionRecord

FIRST_LOOK = 20


def looks(total: int) -> list[int]:
    points, n = [], FIRST_LOOK
    while n < total:
        points.append(n)
        n *= 2
    return points


@functools.lru_cache(maxsize=256)
def stop_thresholds(floor: float, total: int, alpha: float) -> tuple[tuple[int, int], ...]:
    """(look, most correct answers that still reject the floor there; -1: none) for every look.
    The exact test is monotone in the count, so a bisection per look finds it."""
    points = looks(total)
    thresholds = []
    for n in points:
        low, high = -1, n  # every count <= low rejects the floor; no count > high does
        while low < high:
            middle = (low + high + 1) // 2
            if below_floor_p(middle, n, floor) < alpha / len(points):
                low = middle
            else:
                high = middle - 1
        thresholds.append((n, low))
    return tuple(thresholds)


@dataclass(frozen=True)
class EarlyStop:
    """The sequential test of one cell. Built where scipy is loaded (the driver), it carries its
    critical counts, so checking it where the cell runs is a comparison of integers."""

    floor: float
    total: int
    alpha: float = 0.001
    extraction: str = "flexible"
    thresholds: tuple[tuple[int, int], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.floor > 0:
            object.__setattr__(self, "thresholds", stop_thresholds(self.floor, self.total, self.alpha))

    def check(self, records: list[QuestionRecord]) -> str | None:
        """A reason to stop now, or None. Called after every answer; tests only at the looks."""
        answered = [r for r in records if r.error is None]
        limit = dict(self.thresholds).get(len(answered))
        if limit is None:
            return None
        correct = sum(r.correct_strict if self.extraction == "strict" else r.correct for r in answered)
        if correct <= limit:
            level = self.alpha / len(self.thresholds)
            return (f"stopped early after {len(answered)} questions: {correct} correct, below floor {self.floor:.2f} "
                    f"(at most {limit} of {len(answered)} rejects it at p < {level:.2g}: alpha {self.alpha} split "
                    f"over {len(self.thresholds)} looks)")
        return None
