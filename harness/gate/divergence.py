"""Teacher-forced divergence from the reference cell (pure): evidence beyond one bit per question.

Every cell scores the same fixed continuation of each prompt teacher-forced (the question's reference
solution; harness.benchmark.evaluator). For a question both a cell and its reference scored, on the
same tokens, the divergence is the mean over the continuation's tokens of |log p_cell - log p_ref|
(nats per token); the top-1 share is the share of positions where the two servers' most likely
next tokens differ. Healthy backends differ a little (numerics); a bug that reads wrong KV rows
changes every token after the damage, whether or not the final answer changes.

The test: a question is *beyond* when its divergence exceeds the tolerance (nats per token; the
model's `divergence_tolerance`, else `gate.divergence.tolerance`). Null hypothesis, a healthy cell:
at most `healthy_share` of its questions are beyond. Exact one-sided binomial test on the count
beyond, at the cell's share of the run's alpha like every other test of the cell. It can fail a
cell; it cannot hold one undecided (a cell it does not reject is judged by its other tests).
Questions are paired by (split, index); a question either side lacks, or whose continuation the
two servers tokenized differently, is left out (counted in the reason).

Early stop (`DivergenceStop`): when the reference came back before a cell starts (measured, not
under its floor, not stopped early; once judged, only if it can vouch), the cell's slot gets the
reference's teacher records and tests the first 20, 40, 80, ... comparable questions of
the seeded order as they come back, at its share of the cell's early-stop alpha split over the looks
(critical counts computed by the driver, so the worker compares integers), as the floor's looks do
(harness.gate.sequential).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.gate.sequential import InOrder, looks
from harness.gate.stats import binomial_cdf
from harness.records import QuestionRecord, TeacherForced

TOP_QUANTILE = 0.95  # what a cell records of its questions' divergences, for `regress calibrate`


@dataclass(frozen=True)
class Divergence:
    n: int  # questions compared
    beyond: int  # of them, beyond the tolerance
    tolerance: float
    healthy_share: float
    p: float  # of "more beyond than a healthy cell has"
    nats: float  # mean divergence per token over the questions
    top1: float  # share of positions whose top-1 token differs, over all compared positions
    high: float  # the TOP_QUANTILE quantile of the questions' divergences
    unpaired: int  # questions both answered that could not be compared (see the module docstring)

    @property
    def share(self) -> float:
        return self.beyond / self.n if self.n else 0.0

    def describe(self, alpha: float | None = None) -> str:
        from harness.gate.stats import wilson_interval

        verdict = "" if alpha is None else (f" < {alpha:.2g}" if self.p < alpha else "")
        low, high = wilson_interval(self.beyond, self.n)
        text = (f"divergence vs reference: {self.beyond} of {self.n} questions beyond {self.tolerance:.3g} nats/token "
                f"({self.share:.0%}, 95% CI {low:.0%}-{high:.0%}; healthy: <= {self.healthy_share:.0%}), "
                f"p={self.p:.2g}{verdict}; mean {self.nats:.3g} nats/token, top-1 differs at {self.top1:.1%} of positions")
        if self.unpaired:
            text += f" ({self.unpaired} not comparable)"
        return text


def question_divergence(cell: TeacherForced, reference: TeacherForced) -> tuple[float, int, int] | None:
    """(mean |delta log p| per token, positions whose top-1 differs, positions), or None when the two
    cannot be compared: either failed or is empty, or the servers tokenized the continuation differently."""
    if cell.error or reference.error or not cell.token_ids or cell.token_ids != reference.token_ids:
        return None
    if len(cell.logprobs) != len(cell.token_ids) or len(reference.logprobs) != len(reference.token_ids):
        return None
    total = sum(abs(a - b) for a, b in zip(cell.logprobs, reference.logprobs, strict=True))
    flips = sum(a != b for a, b in zip(cell.top_ids, reference.top_ids, strict=False))
    return total / len(cell.token_ids), flips, len(cell.token_ids)


def divergences(cell: list[QuestionRecord], reference: list[QuestionRecord]) -> tuple[list[tuple[float, int, int]], int]:
    """Per compared question (divergence, top-1 flips, positions), and how many shared questions
    with teacher records on both sides could not be compared."""
    theirs = {(r.split, r.index): r.teacher for r in reference if r.error is None and r.teacher is not None}
    compared, unpaired = [], 0
    for record in cell:
        other = theirs.get((record.split, record.index))
        if record.error is not None or record.teacher is None or other is None:
            continue
        found = question_divergence(record.teacher, other)
        if found is None:
            unpaired += 1
        else:
            compared.append(found)
    return compared, unpaired


def quantile(values: list[float], q: float) -> float:
    """The q quantile (nearest rank, the higher one); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def beyond_p(beyond: int, n: int, healthy_share: float) -> float:
    """One-sided exact binomial p-value for "more than `healthy_share` of questions are beyond":
    P(X >= beyond), X ~ Bin(n, healthy_share), as scipy's `binomtest(..., alternative="greater")`
    (the tests compare them), i.e. P(n - X <= n - beyond) with n - X ~ Bin(n, 1 - healthy_share)."""
    if n == 0 or beyond == 0:
        return 1.0
    return min(1.0, binomial_cdf(n - beyond, n, 1.0 - healthy_share))


def divergence_test(cell: list[QuestionRecord], reference: list[QuestionRecord], tolerance: float,
                    healthy_share: float) -> Divergence | None:
    """The divergence test of a cell against its reference; None when no question could be compared."""
    compared, unpaired = divergences(cell, reference)
    if not compared:
        return None
    values = [value for value, _, _ in compared]
    beyond = sum(value > tolerance for value in values)
    positions = sum(count for _, _, count in compared)
    return Divergence(n=len(compared), beyond=beyond, tolerance=tolerance, healthy_share=healthy_share,
                      p=beyond_p(beyond, len(compared), healthy_share), nats=sum(values) / len(values),
                      top1=sum(flips for _, flips, _ in compared) / positions if positions else 0.0,
                      high=quantile(values, TOP_QUANTILE), unpaired=unpaired)


Key = tuple[str, int]  # (split, index): a question's identity


@dataclass(frozen=True)
class DivergenceStop:
    """The divergence test as a sequential test of one running cell, against its reference's records."""

    reference: tuple[tuple[Key, TeacherForced], ...]
    order: tuple[Key, ...]  # the plan's questions in its seeded order
    tolerance: float
    healthy_share: float
    alpha: float  # for all its looks together
    critical: tuple[tuple[int, int], ...] = field(init=False, default=())  # (look, least count beyond that rejects)

    def __post_init__(self) -> None:

        points = looks(len(self.order))
        found = []
        for n in points:
            # beyond_p falls as the count grows: bisect for the least count that rejects (n + 1: none).
            low, high = 1, n + 1
            while low < high:
                middle = (low + high) // 2
                if beyond_p(middle, n, self.healthy_share) < self.alpha / len(points):
                    high = middle
                else:
                    low = middle + 1
            found.append((n, low))
        object.__setattr__(self, "critical", tuple(found))


class DivergenceLooks:
    """`DivergenceStop` as answers come in, in any order: each look tests the first n comparable
    questions of the seeded order once every question before them is back (harness.gate.sequential's
    `InOrder`, as the floor's looks do). A question without a comparable teacher record is passed over."""

    def __init__(self, rule: DivergenceStop) -> None:
        self.rule = rule
        reference = dict(rule.reference)

        def divergence(record: QuestionRecord) -> float | None:
            theirs = reference.get((record.split, record.index))
            if record.error is not None or record.teacher is None or theirs is None:
                return None
            found = question_divergence(record.teacher, theirs)
            return found[0] if found is not None else None

        self.values = InOrder(rule.order, key=lambda record: (record.split, record.index), admit=divergence)
        self.pending = list(rule.critical)

    def add(self, record: QuestionRecord) -> str | None:
        """One more result; a reason to stop when a look it completes rejects "healthy"."""
        values = self.values.add(record)
        while self.pending and self.pending[0][0] <= len(values):
            n, least = self.pending.pop(0)
            beyond = sum(value > self.rule.tolerance for value in values[:n])
            if beyond >= least:
                level = self.rule.alpha / len(self.rule.critical)
                return (f"stopped early after the first {n} comparable questions of the seeded order: divergence "
                        f"vs reference: {beyond} of {n} beyond {self.rule.tolerance:.3g} nats/token (at least {least} "
                        f"of {n} rejects healthy <= {self.rule.healthy_share:.0%} at p < {level:.2g}: alpha "
                        f"{self.rule.alpha:.2g} split over {len(self.rule.critical)} looks)")
        return None
