"""What earlier runs of a suite tell this one: the latest run's verdicts and durations (for ordering
and planning), and, per cell, the last run where that cell passed under the same protocol (the
history test of the gate pairs with its answers).

Searching back per cell, rather than using the latest run alone, keeps the history test for a cell
that failed or was not selected last night: its last good answers are still the baseline.
"""

from __future__ import annotations

from harness.records import CellOutcome, CellResult, RunInfo, Status, latest_per_cell
from harness.results.archive import RunArchive
from harness.results.catalog import answers_outcome

MAX_RUNS_SEARCHED = 30


class History:
    """Earlier finished runs of one suite with one protocol fingerprint, newest first."""

    def __init__(self, archive: RunArchive, runs: list[RunInfo], pinned_run: RunInfo | None = None,
                 pinned_problem: str | None = None) -> None:
        self.archive = archive
        self.runs = runs[:MAX_RUNS_SEARCHED]
        self.pinned_run = pinned_run
        self.pinned_problem = pinned_problem  # why the suite's pinned run cannot be paired with, if it cannot
        self._cells: dict[str, dict[str, CellResult]] = {}

    @classmethod
    def of(cls, archive: RunArchive, suite: str, fingerprint: str, current_run_id: str,
           pinned_run_id: str | None = None) -> History:
        every = [info for info in reversed(archive.runs(suite)) if info.run_id != current_run_id]
        runs = [info for info in every if info.protocol_fingerprint == fingerprint]
        pinned, problem = None, None
        if pinned_run_id:
            pinned = next((info for info in every if info.run_id == pinned_run_id), None)
            if pinned is None:
                problem = (f"gate.pinned_run {pinned_run_id} is not a run of suite {suite} in results/ or MLflow; "
                           "`regress calibrate` lists the runs that can be pinned")
            elif pinned.protocol_fingerprint != fingerprint:
                problem = (f"gate.pinned_run {pinned_run_id} asked other questions (protocol "
                           f"{pinned.protocol_fingerprint}, this run {fingerprint}): its answers cannot be paired")
                pinned = None
        return cls(archive, runs, pinned, problem)

    def _results(self, run: RunInfo) -> dict[str, CellResult]:
        if run.run_id not in self._cells:
            self._cells[run.run_id] = latest_per_cell(self.archive.cells(run.run_id))
        return self._cells[run.run_id]

    def latest(self) -> list[CellResult]:
        """The verdicts of the latest earlier run (empty on a first run)."""
        return list(self._results(self.runs[0]).values()) if self.runs else []

    def recent_regressions(self) -> set[str]:
        """Cells that failed or mismatched in the latest earlier run."""
        return {result.cell_id for result in self.latest() if result.status.is_regression}

    def last_pass(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        """(run id, answers) of the newest earlier run in which the cell passed, if any."""
        for run in self.runs:
            found = self._passed(run, cell_id)
            if found is not None:
                return found
        return None

    def pinned(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        """(run id, answers) of the cell in the suite's pinned run, if it passed there."""
        return self._passed(self.pinned_run, cell_id) if self.pinned_run else None

    def _passed(self, run: RunInfo, cell_id: str) -> tuple[str, CellOutcome] | None:
        result = self._results(run).get(cell_id)
        if result is None or result.status is not Status.PASS:
            return None
        outcome = answers_outcome(cell_id, self.archive.questions(run.run_id, cell_id))
        return (run.run_id, outcome) if outcome is not None else None
