"""One false-fail budget per run, spent across cells, tests and looks (pure).

A healthy cell turns `fail` only if one of its tests rejects by chance: an early-stop look, a test
on the planned questions (stage 1), or a test on the extension (stage 2). Each gets a fixed share
of the cell's part of the run's `alpha`, and a union bound adds them up:

    alpha                                   the run's: P(any healthy cell fails) <= alpha
    └─ alpha / cells                        one cell's
       ├─ × early_stop_share                its early-stop looks (split over its sequential tests,
       │                                    floor and divergence, then over their looks)
       └─ × (1 - early_stop_share)          its final tests
          ├─ × (1 - extension_share)        stage 1: the planned questions (split over its tests)
          └─ × extension_share              stage 2: all questions after an extension (ditto)

A suite that cannot extend (no `extend_to`, or a protocol whose questions are fixed) gives
stage 1 the whole of the final tests' share.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """Where a run's `alpha` goes. `Budget(0.01, 72, 0.1, 0.7).stage(2)`: one cell's stage-2 share."""

    alpha: float
    cells: int
    early_stop_share: float = 0.1
    extension_share: float = 0.0  # 0: the suite does not extend

    @property
    def per_cell(self) -> float:
        return self.alpha / max(self.cells, 1)

    @property
    def early_stop(self) -> float:
        """For all early-stop looks of one cell together."""
        return self.per_cell * self.early_stop_share

    def stage(self, number: int) -> float:
        """For all tests one cell makes at stage `number` (1: planned questions, 2: extension)."""
        final = self.per_cell * (1 - self.early_stop_share)
        if number == 1:
            return final * (1 - self.extension_share)
        if number == 2:
            return final * self.extension_share
        raise ValueError(f"stage {number}: the gate has stages 1 and 2")

    def describe(self) -> str:
        """One line for run.json and the README: where the budget goes."""
        text = (f"alpha {self.alpha:g} over {self.cells} cells ({self.per_cell:.2g} each): early stop "
                f"{self.early_stop:.2g}, planned questions {self.stage(1):.2g}")
        if self.extension_share:
            text += f", extension {self.stage(2):.2g}"
        return text
