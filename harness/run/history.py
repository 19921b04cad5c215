"""What earlier runs of a suite tell this one: the latest run's verdicts and durations (for ordering
and planning), per cell its baseline (the history test of the gate pairs with its answers), the
suite's pinned run, and the launch-spread samples earlier runs measured (harness.gate.launches):
those they recorded, and night to night, the first launches of each model's cells in consecutive runs.

A cell's baseline pools its answers in its newest runs under the same protocol where it was judged
on answers and was not a regression (`pass` or `inconclusive`), up to `gate.history_runs` of them
(each run's launches are launches of the pool): one earlier launch carries a whole launch's spread
into the test, five carry a fifth of it. Searching back per cell, rather than using the latest run
alone, keeps the history test for a cell that failed or was not selected last night. `fail` and
`mismatch` are passed over, and so is an undecided night whose evidence of a drop against its
reference (a reference cell: against its history) was above 1 (harness.gate.evidence: a drop the
night could not prove yet, which would otherwise enter the
baseline of the nights after it and hide itself from the history test; measured in
benchmarks/gate_calibration.py, a 3-point drop red within 3 nights); never a merely undecided
night: pooling only the nights a cell passed would pool the nights its launches came out high (a cell at the edge passes on its good
nights), and a cell whose one passing night was lucky would then be held undecided against it for
good (seen in benchmarks/gate_calibration.py: a cell compared with its first night's 0.908 for five
nights while it scored 0.89). The tests that only fail a cell and accumulate or pool over
nights (the evidence across nights, the model-wide tests) pool from the cell's last pass on instead,
so that a drop that persists does not water down what it is measured against (`baseline`).

`gate.pinned_run: auto` pins the first finished run of this protocol that was not red (no `fail`,
no `mismatch`; the oldest such run kept): every later night of the protocol is paired with its
cells that were not a regression there, so a drift that never shows from one night to the next
still grows against the pin. A new protocol (another fingerprint) starts a new series and a new pin.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.gate.evidence import NightDrop, leans_to_a_drop
from harness.gate.launches import Answers, centred_sample, drop_with_variance
from harness.gate.stats import paired_comparison
from harness.gate.verdict import first_launch
from harness.records import CellOutcome, CellResult, LaunchSample, RunInfo, Status, latest_per_cell
from harness.results.archive import RunArchive
from harness.results.catalog import answers_outcome

MAX_RUNS_SEARCHED = 30
# Night to night, launch spread is read from consecutive pairs among this many newest runs: a model
# of C cells gets C - 1 degrees of freedom a pair. 15 runs (14 pairs) put the gate's estimate for
# DeepSeek-V2-Lite's 3 PR cells within 25% of the truth in 70% of benchmark trials where 6 runs gave
# 64%, Kimi-Linear's 6 cells 97% where 85% (benchmarks/gate_calibration.py, "launch spread
# estimate", 33 trials; 97% / 68% on 100 at commit 494227c), at the cost of reading each model's
# answers in 15 runs, not 6.
SPREAD_RUNS = 15
BASELINE_STATUSES = (Status.PASS, Status.INCONCLUSIVE)  # judged on answers, not a regression
PINNED_STATUSES = BASELINE_STATUSES
AUTO_PIN = "auto"


@dataclass(frozen=True)
class Baseline:
    """A cell's answers in its newest runs where it was not a regression, newest first: the gate
    pools them, each run's launches launches of the pool (harness.gate.verdict)."""

    run_ids: tuple[str, ...]
    outcomes: tuple[CellOutcome, ...]


class History:
    """Earlier finished runs of one suite with one protocol fingerprint, newest first."""

    def __init__(self, archive: RunArchive, runs: list[RunInfo], pinned_run: RunInfo | None = None,
                 pinned_problem: str | None = None, pool: int = 1) -> None:
        self.archive = archive
        self.runs = runs[:MAX_RUNS_SEARCHED]
        self.pinned_run = pinned_run
        self.pinned_problem = pinned_problem  # why the suite's pinned run cannot be paired with, if it cannot
        self.pool = max(pool, 1)  # gate.history_runs: passing runs a baseline pools
        self._cells: dict[str, dict[str, CellResult]] = {}
        self._baselines: dict[tuple[str, bool], Baseline | None] = {}  # earlier runs do not change while this one runs
        self._outcomes: dict[tuple[str, str], CellOutcome | None] = {}
        self._night_samples: dict[tuple[str, str], list[LaunchSample]] = {}
        self._recorded_samples: dict[str, list[LaunchSample]] = {}  # model -> `recorded_samples` (read, never changed)

    @classmethod
    def of(cls, archive: RunArchive, suite: str, fingerprint: str, current_run_id: str,
           pinned_run_id: str | None = None, pool: int = 1) -> History:
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
        return cls(archive, runs, pinned, problem, pool)

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

    def baseline(self, cell_id: str, before_streak: bool = False) -> Baseline | None:
        """The cell's answers in its newest earlier runs where it was not a regression (up to `pool`),
        to be pooled; None when there is none. `before_streak`: only from the run where it last
        passed on (`_before_streak`), for the tests that must not be watered down by a drop that
        persists (the evidence across nights, the model-wide tests); the paired history test, which
        can hold a cell open, pools its newest runs whatever they were (a baseline of its passing
        nights only is one of its lucky launches, and would hold the cell open for good)."""
        key = (cell_id, before_streak)
        if key in self._baselines:
            return self._baselines[key]
        found = []
        for run in self._before_streak(cell_id) if before_streak else self.runs:
            if not before_streak and self._leaned_to_a_drop(run, cell_id):
                continue
            answers = self._answers(run, cell_id, BASELINE_STATUSES)
            if answers is not None:
                found.append(answers)
                if len(found) == self.pool:
                    break
        self._baselines[key] = Baseline(tuple(r for r, _ in found), tuple(o for _, o in found)) if found else None
        return self._baselines[key]

    def _leaned_to_a_drop(self, run: RunInfo, cell_id: str) -> bool:
        """The cell was left undecided there with its evidence of a drop against its reference (a
        reference cell: against its history) above 1 (harness.gate.evidence): a drop that the night
        could not prove yet. Such a night is no baseline for the nights after (it would water down
        the drop the history test looks for); a healthy cell leans so only when its drops since it
        last passed came out beyond the midpoint of their margin and gate.min_effect, on average."""
        result = self._results(run).get(cell_id)
        if result is None or result.status is not Status.INCONCLUSIVE:
            return False
        # The evidence against the reference where the cell has one: the history's own evidence was
        # measured against this baseline, so a night that leaned only against one lucky launch would
        # keep that launch the baseline night after night (seen in benchmarks/gate_calibration.py:
        # a healthy cell held open against its first night's 0.912 for five nights while it
        # scored 0.90). A reference cell has only the history's.
        return leans_to_a_drop(result.evidence, ("reference",) if "reference" in result.evidence else None)

    def _before_streak(self, cell_id: str) -> list[RunInfo]:
        """The searched runs from the one before the cell's current streak of nights it did not pass
        (its newest runs where it was inconclusive or a regression) on: a drop that persists does not
        water down the baseline its evidence is measured against (harness.gate.evidence)."""
        for position, run in enumerate(self.runs):
            result = self._results(run).get(cell_id)
            if result is not None and result.status is Status.PASS:
                return self.runs[position:]
        return self.runs

    def pinned(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        """(run id, answers) of the cell in the suite's pinned run, if it was not a regression there."""
        return self._answers(self.pinned_run, cell_id, PINNED_STATUSES) if self.pinned_run else None

    def carried_evidence(self, cell_id: str) -> dict[str, tuple[int, float]]:
        """The cell's accumulated evidence (harness.gate.evidence) from the newest earlier run it was
        judged in, unless it passed there (a pass starts it again)."""
        result = self._carrying(cell_id)
        return dict(result.evidence) if result is not None else {}

    def carried_nights(self, cell_id: str) -> dict[str, list[NightDrop]]:
        """The nights behind `carried_evidence`, oldest first, for tonight's likelihood ratio to read.
        A run written before they were kept has none: the cell's evidence starts again there."""
        result = self._carrying(cell_id)
        return {} if result is None else {
            key: [NightDrop(*night) for night in nights] for key, nights in result.evidence_nights.items()}

    def _carrying(self, cell_id: str) -> CellResult | None:
        """The cell's verdict in the newest earlier run that judged it, unless it passed there."""
        for run in self.runs:
            result = self._results(run).get(cell_id)
            if result is not None:
                return None if result.status is Status.PASS else result
        return None

    def models(self) -> set[str]:
        """The models whose cells the searched runs judged."""
        return {result.model for run in self.runs for result in self._results(run).values()}

    def launch_samples(self, model: str, extraction: str) -> list[LaunchSample]:
        """What the searched runs measured of launch spread on `model`'s cells (harness.gate.launches):
        the samples they recorded (second launches, relaunches' unselected launches), and night to
        night, each pair of consecutive runs among the newest `SPREAD_RUNS` as one `centred_sample`
        of the model's cells judged on answers in both."""
        return self.recorded_samples(model) + self._night_to_night(model, extraction)

    def recorded_samples(self, model: str) -> list[LaunchSample]:
        """The launch samples the searched runs recorded on `model`'s cells: launches of one
        configuration in one run, made whatever their answers (harness.gate.launches.launch_sample)."""
        if model not in self._recorded_samples:
            self._recorded_samples[model] = [result.launch_sample for run in self.runs
                                             for result in self._results(run).values()
                                             if result.model == model and result.launch_sample is not None]
        return self._recorded_samples[model]

    def _night_to_night(self, model: str, extraction: str) -> list[LaunchSample]:
        key = (model, extraction)
        if key not in self._night_samples:
            recent = self.runs[:SPREAD_RUNS]
            samples = []
            for after, before in zip(recent, recent[1:], strict=False):
                drops = []
                for cell_id, result in self._results(after).items():
                    if result.model != model:
                        continue
                    now, then = self._answers(after, cell_id, BASELINE_STATUSES), self._answers(before, cell_id, BASELINE_STATUSES)
                    if now is None or then is None:
                        continue
                    paired = paired_comparison(Answers.of(first_launch(now[1].questions), extraction),
                                               Answers.of(first_launch(then[1].questions), extraction))
                    if paired is not None:
                        drops.append(drop_with_variance(paired.losses, paired.gains, paired.n))
                sample = centred_sample(drops)
                if sample is not None:
                    samples.append(sample)
            self._night_samples[key] = samples
        return self._night_samples[key]

    def _answers(self, run: RunInfo, cell_id: str, statuses: tuple[Status, ...]) -> tuple[str, CellOutcome] | None:
        result = self._results(run).get(cell_id)
        if result is None or result.status not in statuses:
            return None
        key = (run.run_id, cell_id)
        if key not in self._outcomes:
            self._outcomes[key] = answers_outcome(cell_id, self.archive.questions(run.run_id, cell_id))
        outcome = self._outcomes[key]
        return (run.run_id, outcome) if outcome is not None else None


def _not_red(info: RunInfo) -> bool:
    """A finished run with a passing cell and no regression (run.json's counts)."""
    counts = {status: count for status, count in info.counts.items() if count}
    regressions = {Status.FAIL.value, Status.MISMATCH.value}
    return (Status.PASS.value in counts and not regressions & set(counts) and not info.interrupted
            and info.ended_at is not None)
