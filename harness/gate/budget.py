"""One false-fail budget per run, spent across cells, tests and looks (pure).

A healthy cell turns `fail` only if one of its tests rejects by chance: an early-stop look, a test
on the planned questions (stage 1), or a test at a later stage (after the extension, after each
relaunch). Each gets a fixed share of the cell's part of the run's `alpha`, and a union bound adds
them up:

    alpha                                   the run's: P(any healthy cell fails) <= alpha
    ├─ × model_share                        the model-wide tests (harness.gate.model_wide), split
    │                                       over the models and their two tests (history, pin)
    └─ × (1 - model_share) / cells          one cell's
       ├─ × early_stop_share                its early-stop looks (split over its sequential tests,
       │                                    floor and divergence, then over their looks)
       ├─ × self_check_share                its self-checks, at stage 1 (harness.gate.self_checks)
       └─ × (1 - early_stop_share - self_check_share)   its final tests
          ├─ × (1 - extension_share)        stage 1: the planned questions, one launch (split over its tests)
          └─ × extension_share              the later stages, split evenly: stage 2 after the
                                            extension (more questions), then one stage per relaunch
                                            (another launch of the server; harness.run.relaunch)

A suite with no later stage (it neither extends nor relaunches) gives stage 1 the whole of the final
tests' share.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """Where a run's `alpha` goes. `Budget(0.01, 72, 0.1, 0.7).stage(2)`: one cell's stage-2 share."""

    alpha: float
    cells: int
    early_stop_share: float = 0.1
    extension_share: float = 0.0  # 0: no stage after the first
    later_stages: int | None = None  # stages after the first (the extension, relaunches); None: 1 if extension_share
    model_share: float = 0.0  # kept for the model-wide tests (0: none)
    self_check_share: float = 0.0  # of each cell's, for its self-checks (0: none)

    @property
    def stages(self) -> int:
        """How many stages a cell can be judged at."""
        later = self.later_stages if self.later_stages is not None else (1 if self.extension_share else 0)
        return 1 + (later if self.extension_share else 0)

    @property
    def per_cell(self) -> float:
        return self.alpha * (1 - self.model_share) / max(self.cells, 1)

    def model_test(self, models: int) -> float:
        """For one model-wide test (two per model: against history and against the pinned run)."""
        return self.alpha * self.model_share / max(2 * models, 1)

    @property
    def self_check(self) -> float:
        """For all self-checks of one cell together."""
        return self.per_cell * self.self_check_share

    @property
    def early_stop(self) -> float:
        """For all early-stop looks of one cell together."""
        return self.per_cell * self.early_stop_share

    def stage(self, number: int) -> float:
        """For all tests one cell makes at stage `number` (1: planned questions; 2, 3, ...: the later
        stages, each an equal part of `extension_share`). A stage the budget has no share for gets 0."""
        final = self.per_cell * (1 - self.early_stop_share - self.self_check_share)
        if number < 1:
            raise ValueError(f"stage {number}: stages count from 1")
        if self.stages == 1:
            return final if number == 1 else 0.0
        if number == 1:
            return final * (1 - self.extension_share)
        return final * self.extension_share / (self.stages - 1) if number <= self.stages else 0.0

    def describe(self) -> str:
        """One line for run.json and the README: where the budget goes."""
        text = (f"alpha {self.alpha:g} over {self.cells} cells ({self.per_cell:.2g} each): early stop "
                f"{self.early_stop:.2g}, " + (f"self-checks {self.self_check:.2g}, " if self.self_check_share else "")
                + f"planned questions {self.stage(1):.2g}")
        if self.stages > 1:
            text += f", each of {self.stages - 1} later stage(s) {self.stage(2):.2g}"
        if self.model_share:
            text += f"; model-wide tests {self.alpha * self.model_share:.2g} in all"
        return text
