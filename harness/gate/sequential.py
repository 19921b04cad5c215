"""Stopping a clearly broken cell early, with a bounded false-stop rate (pure).

While a cell runs (its questions in seeded random order), the answers so far are tested against the
model's floor at fixed looks (20, 40, 80, ... questions). Each look spends alpha / looks (a Bonferroni
split across looks), so the chance that a healthy cell is ever stopped is at most `alpha` however many
looks happen: the test is valid at any look, not only at the end. A cell at 0.15 with a floor of
0.85 stops at the first look; a healthy cell runs to its configured size.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.gate.stats import below_floor_p
from harness.records import QuestionRecord

FIRST_LOOK = 20


def looks(total: int) -> list[int]:
    points, n = [], FIRST_LOOK
    while n < total:
        points.append(n)
        n *= 2
    return points


@dataclass(frozen=True)
class EarlyStop:
    floor: float
    total: int
    alpha: float = 0.001
    extraction: str = "flexible"

    def check(self, records: list[QuestionRecord]) -> str | None:
        """A reason to stop now, or None. Called after every answer; tests only at the looks."""
        answered = [r for r in records if r.error is None]
        points = looks(self.total)
        if self.floor <= 0 or len(answered) not in points:
            return None
        correct = sum(r.correct_strict if self.extraction == "strict" else r.correct for r in answered)
        p_value = below_floor_p(correct, len(answered), self.floor)
        if p_value < self.alpha / len(points):
            return (f"stopped early after {len(answered)} questions: {correct} correct, below floor {self.floor:.2f} "
                    f"(p={p_value:.2g} < {self.alpha / len(points):.2g}, alpha {self.alpha} split over {len(points)} looks)")
        return None
