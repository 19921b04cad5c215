"""Stopping a clearly broken cell early, with a bounded false-stop rate (pure).

While a cell runs (its questions in seeded random order), the answers so far are tested against the
model's floor at fixed looks (20, 40, 80, ... questions). Each look spends alpha / looks (a Bonferroni
split across looks), so the chance that a healthy cell is ever stopped is at most `alpha` however many
looks happen: the test is valid at any look, not only at the end. A cell at 0.15 with a floor of
0.85 stops at the first look; a healthy cell runs to its configured size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from harness.gate.stats import below_floor_p
from harness.records import QuestionRecord

FIRST_LOOK = 20
T = TypeVar("T")


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
    """The sequential test of one cell. Built by the driver, it carries its critical counts, so
    checking it where the cell runs is a comparison of integers."""

    floor: float
    total: int
    alpha: float = 0.001
    extraction: str = "flexible"
    # The plan's question indices in its seeded order; each look tests a prefix of it. Empty: the
    # indices are the positions (0, 1, 2, ...).
    order: tuple[int, ...] = ()
    thresholds: tuple[tuple[int, int], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.floor > 0:
            object.__setattr__(self, "thresholds", stop_thresholds(self.floor, self.total, self.alpha))

    def question_order(self) -> tuple[int, ...]:
        return self.order or tuple(range(self.total))

    def test_look(self, n: int, sample: list[QuestionRecord]) -> str | None:
        """The look at the first n questions of the seeded order (`sample`): a reason to stop, or None."""
        limit = dict(self.thresholds).get(n)
        if limit is None or len(sample) != n:
            return None
        correct = sum(r.correct_strict if self.extraction == "strict" else r.correct for r in sample)
        if correct > limit:
            return None
        level = self.alpha / len(self.thresholds)
        return (f"stopped early after the first {n} answered questions of the seeded order: {correct} correct, below "
                f"floor {self.floor:.4g} (at most {limit} of {n} rejects it at p < {level:.2g}: alpha "
                f"{self.alpha} split over {len(self.thresholds)} looks)")

    def check(self, records: list[QuestionRecord]) -> str | None:
        """A reason to stop, or None, from the records so far in any order (one-off; a running cell
        uses `Looks`, which does the same work once per look instead of once per answer)."""
        looks = Looks(self)
        reasons = [reason for record in records if (reason := looks.add(record))]
        return reasons[0] if reasons else None


class InOrder(Generic[T]):
    """Results that come back in any order, taken in a seeded order: a result is taken once every
    question before it in `order` is back, so the taken ones are always a prefix of the order (a
    random sample), not the ones that came back first. `admit` turns a result into what is kept of
    it, or None to pass it over (a transport failure is no answer); the looks test prefixes of `taken`."""

    def __init__(self, order: Sequence[Hashable], key: Callable[[QuestionRecord], Hashable],
                 admit: Callable[[QuestionRecord], T | None]) -> None:
        self.order, self.key, self.admit = order, key, admit
        self.done: dict[Hashable, QuestionRecord] = {}
        self.complete = 0  # the first `complete` questions of the order are all back
        self.taken: list[T] = []

    def add(self, record: QuestionRecord) -> list[T]:
        self.done[self.key(record)] = record
        while self.complete < len(self.order) and self.order[self.complete] in self.done:
            kept = self.admit(self.done[self.order[self.complete]])
            if kept is not None:
                self.taken.append(kept)
            self.complete += 1
        return self.taken


class Looks:
    """The sequential test as answers come in, in any order. Each look tests the first n answered
    questions of the seeded order, once every question before them is back (`InOrder`: a bug that
    writes junk up to the token limit answers last, so the first to come back would be the healthy
    ones). A question that failed in transport is passed over, so it never holds the looks up."""

    def __init__(self, rule: EarlyStop) -> None:
        self.rule = rule
        self.answered = InOrder(rule.question_order(), key=lambda record: record.index,
                                admit=lambda record: record if record.error is None else None)
        self.pending = [n for n, _ in rule.thresholds]  # looks not taken yet, smallest first

    def add(self, record: QuestionRecord) -> str | None:
        """One more result; a reason to stop when a look it completes rejects the floor."""
        answered = self.answered.add(record)
        while self.pending and self.pending[0] <= len(answered):
            n = self.pending.pop(0)
            reason = self.rule.test_look(n, answered[:n])
            if reason:
                return reason
        return None
