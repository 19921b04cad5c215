"""What earlier runs of a suite tell this one: the latest run's verdicts and durations (for ordering
and planning), and, per cell, its baseline (the history test of the gate pairs with its answers):
the newest run under the same protocol in which the cell was judged on answers and was not a
regression (`pass` or `inconclusive`), and the suite's pinned run.

Searching back per cell, rather than using the latest run alone, keeps the history test for a cell
that failed or was not selected last night: its last answers that were not a regression are still
the baseline. Only `fail` and `mismatch` are passed over, never a merely undecided night: choosing
"the newest run where the cell passed" would choose nights that were lucky (a cell at its floor
passes on its good nights), and a test against a lucky night rejects too often.

`gate.pinned_run: auto` pins the first finished run of this protocol that was not red (no `fail`,
no `mismatch`; the oldest such run kept): every later night of the protocol is paired with its
cells that were not a regression there, so a drift that never shows from one night to the next
still grows against the pin. A new protocol (another fingerprint) starts a new series and a new pin.
"""

from __future__ import annotations

from harness.records import CellOutcome, CellResult, RunInfo, Status, latest_per_cell
from harness.results.archive import RunArchive
from harness.results.catalog import answers_outcome

MAX_RUNS_SEARCHED = 30
BASELINE_STATUSES = (Status.PASS, Status.INCONCLUSIVE)  # judged on answers, not a regression
AUTO_PIN = "auto"


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
        if pinned_run_id == AUTO_PIN:
            pinned = next((info for info in reversed(runs) if _not_red(info)), None)
        elif pinned_run_id:
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

    def baseline(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        """(run id, answers) of the newest earlier run in which the cell was not a regression, if any."""
        for run in self.runs:
            found = self._answers(run, cell_id, BASELINE_STATUSES)
            if found is not None:
                return found
        return None

    def pinned(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        """(run id, answers) of the cell in the suite's pinned run, if it was not a regression there."""
        return self._answers(self.pinned_run, cell_id, BASELINE_STATUSES) if self.pinned_run else None

    def _answers(self, run: RunInfo, cell_id: str, statuses: tuple[Status, ...]) -> tuple[str, CellOutcome] | None:
        result = self._results(run).get(cell_id)
        if result is None or result.status not in statuses:
            return None
        outcome = answers_outcome(cell_id, self.archive.questions(run.run_id, cell_id))
        return (run.run_id, outcome) if outcome is not None else None


def _not_red(info: RunInfo) -> bool:
    """A finished run with a passing cell and no regression (run.json's counts)."""
    counts = {status: count for status, count in info.counts.items() if count}
    regressions = {Status.FAIL.value, Status.MISMATCH.value}
    return (Status.PASS.value in counts and not regressions & set(counts) and not info.interrupted
            and info.ended_at is not None)
