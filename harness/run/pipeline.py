"""One run of a suite, from its matrix to every sink: a thin composition of the parts.

    open (new run, or --resume) -> history -> sinks.open -> schedule every cell (gated as it
    finishes) -> extend inconclusive cells -> release waiting cells -> attribute -> sinks.close

The scheduler (`harness.run.ray.scheduler`) keeps the GPUs busy; the priority order comes from
`harness.run.scheduling.placement`; verdicts from `gating`. Ctrl-C or SIGTERM kills every slot
(their servers die with them), keeps the finished cells, and leaves a run that `--resume` completes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.benchmark.base import ProtocolPlan
from harness.benchmark.evaluator import EvalSettings
from harness.engine.launch import cell_launch_spec, planned_argv
from harness.gate.attribution import explain
from harness.gate.budget import Budget
from harness.gate.divergence import DivergenceStop
from harness.gate.sequential import EarlyStop
from harness.gate.stats import preload as preload_statistics
from harness.records import CellOutcome, CellResult, ExitCode, RunInfo, Status, latest_per_cell, run_exit_code
from harness.results.archive import archives
from harness.results.catalog import stored_outcome
from harness.results.provenance import closed_run_info, new_run_info
from harness.results.reporting import warner
from harness.results.sinks import Sinks, standard_sinks
from harness.results.store import ResultsStore, new_run_id
from harness.results.tracking import Tracker
from harness.run.across_cells import judge_models, name_broken_references
from harness.run.build import RunInputs
from harness.run.cell import CellJob
from harness.run.extension import extend
from harness.run.gating import Gating
from harness.run.history import AUTO_PIN, History
from harness.run.ray.scheduler import Interrupted, Scheduler
from harness.run.relaunch import relaunch
from harness.run.scheduling.durations import Durations
from harness.run.scheduling.placement import longest_first, priority_class, priority_order
from harness.run.signals import StopRequest, stop_on_signals
from harness.suite.matrix import Cell


@dataclass(frozen=True)
class RunOptions:
    results_dir: Path
    tracking_uri: str | None
    trigger: str = "manual"
    resume: str | None = None
    retry_errors: bool = False
    fail_fast: bool = False
    quiet: bool = False
    tags: tuple[tuple[str, str], ...] = ()  # recorded in run.json and on the MLflow parent run


@dataclass(frozen=True)
class RunReport:
    """How a run ended: run.json, every cell's verdict, and the answers judged cells were judged on."""

    info: RunInfo
    results: list[CellResult]
    answers: dict[str, CellOutcome]
    exit_code: ExitCode


class _FailFast(BaseException):
    """A confirmed regression under --fail-fast: stop scheduling, keep what finished."""


@dataclass
class CellJobs:
    """What a placed cell's slot runs: its launch spec, client settings and early-stop test. Owns
    when each cell was first queued (for `timings.queued_s`)."""

    inputs: RunInputs
    queued_at: dict[str, float] = field(default_factory=dict)
    # Whether a cell has been judged, and its answers when it can vouch for a given cell (Gating's).
    judged: Callable[[str], bool] = lambda cell_id: False
    vouching: Callable[[Cell], CellOutcome | None] = lambda cell: None
    measured: dict[str, CellOutcome] = field(default_factory=dict)  # back from a slot, not judged yet
    # Early stop looks at a cell's first launch only: a relaunch (harness.run.relaunch) would spend
    # the cell's early-stop share again.
    looks: bool = True

    def notice(self, cell: Cell, outcome: CellOutcome) -> None:
        """A finished cell's outcome, before it is judged (the scheduler places the next cells first).
        Kept only when nothing already says it is broken: measured, labelled right, not stopped early,
        and not under its model's floor (every cell would diverge from a broken reference)."""
        score = outcome.score
        if (outcome.error is None and not outcome.mismatches and not outcome.stopped_early and score is not None
                and score.n > 0 and score.accuracy >= cell.model.floor):
            self.measured[cell.cell_id] = outcome

    def reference_answers(self, cell: Cell) -> CellOutcome | None:
        """The reference's answers for `cell`'s divergence early stop: once judged, only when it can
        vouch for the cell; before that, when it came back measured and was not stopped early."""
        if cell.reference_cell is None:
            return None
        if self.judged(cell.reference_cell):
            return self.vouching(cell)
        return self.measured.get(cell.reference_cell)

    def queue(self, cells: list[Cell]) -> None:
        for cell in cells:
            self.queued_at.setdefault(cell.cell_id, time.time())

    def __call__(self, cell: Cell, devices: tuple[str, ...]) -> CellJob:
        suite = self.inputs.loaded.suite
        spec = cell_launch_spec(self.inputs.loaded, cell, self.inputs.data.source, devices=devices)
        settings = EvalSettings(concurrency=suite.concurrency, request_timeout_s=suite.request_timeout_s,
                                max_attempts=suite.request_attempts, question_deadline_s=suite.question_deadline_s,
                                model_name="default",
                                teacher_forcing=suite.gate.divergence.enabled and spec.engine.teacher_forcing,
                                self_checks=self_check_count(self.inputs) if self.looks and spec.engine.teacher_forcing
                                else 0,
                                self_check_seed=suite.seed, flush_route=spec.engine.flush_route)
        early_stop = divergence_stop = None
        budget = run_budget(self.inputs)
        diverges = suite.gate.divergence.enabled and cell.reference_cell is not None
        # The early-stop share is split evenly over the sequential tests a cell can make (a union bound).
        share = budget.early_stop / max(1, (cell.model.floor > 0) + diverges)
        if budget.early_stop > 0 and self.looks:
            # The looks test the floor, which holds for test questions: they look at those alone.
            test = self.inputs.plan.test_indices()
            early_stop = EarlyStop(cell.model.floor, len(test), share, suite.gate.extraction, order=test)
            reference = self.reference_answers(cell) if diverges else None
            if reference is not None:
                spec_of = suite.gate.divergence
                divergence_stop = DivergenceStop(
                    reference=tuple(((r.split, r.index), r.teacher) for r in reference.questions
                                    if r.error is None and r.teacher is not None),
                    order=tuple((p.split, p.index) for p in self.inputs.plan.prompts),
                    tolerance=cell.model.divergence_tolerance or spec_of.tolerance,
                    healthy_share=spec_of.healthy_share, alpha=share)
        return CellJob(spec=spec, settings=settings, queued_at=self.queued_at[cell.cell_id],
                       stall_timeout_s=suite.stall_timeout_s, early_stop=early_stop, divergence_stop=divergence_stop)


def extends(inputs: RunInputs) -> bool:
    """Whether undecided cells can be asked more questions: the suite extends and its protocol can."""
    gate = inputs.loaded.suite.gate
    return bool(gate.extend_to and gate.extend_to > len(inputs.plan.prompts) and inputs.plan.extensible)


def run_budget(inputs: RunInputs) -> Budget:
    """The run's false-fail budget (harness.gate.budget): every cell of the matrix; later stages for
    the extension (when the suite extends and its protocol can) and for each relaunch."""
    gate = inputs.loaded.suite.gate
    later = int(extends(inputs)) + gate.max_launches - 1
    checks = self_check_count(inputs) > 0
    return Budget(gate.alpha, len(inputs.matrix.cells), gate.early_stop_share,
                  gate.extension_share if later else 0.0, later_stages=later, model_share=gate.model_wide_share,
                  self_check_share=gate.self_checks.share if checks else 0.0)


def self_check_count(inputs: RunInputs) -> int:
    """Questions each cell asks again inside itself (harness.benchmark.self_checks): none without
    teacher texts or teacher forcing (the checks score them)."""
    gate = inputs.loaded.suite.gate
    if not gate.divergence.enabled or not any(p.teacher for p in inputs.plan.prompts):
        return 0
    return gate.self_checks.count(len(inputs.plan.prompts))


def decide(inputs: RunInputs, gating: Gating, schedule: Any) -> None:
    """After the first pass: name references their cells all diverge from alike, extend undecided
    cells, launch them again (both within gate.undecided_budget), then test each model's cells
    together (harness.gate.model_wide)."""
    name_broken_references(gating, inputs.matrix.by_id())
    if gating.extends:
        extend(inputs, gating, schedule)
    relaunch(inputs, gating, schedule)
    judge_models(gating, len({cell.model.id for cell in inputs.matrix.cells}))


def failed_first(cells: list[Cell], history: History, enabled: bool) -> set[str]:
    """Cells that failed in the latest run and their references, when `cluster.failed_first`
    runs them before the rest (a PR learns its verdict sooner)."""
    if not enabled:
        return set()
    failed = history.recent_regressions()
    references = {cell.reference_cell for cell in cells if cell.cell_id in failed and cell.reference_cell}
    return failed | references


def _open(inputs: RunInputs, options: RunOptions, console: Console) -> tuple[ResultsStore, RunInfo, list[CellResult]]:
    """A new run, or the one named by --resume with the cells it already has."""
    if options.resume:
        store = ResultsStore.existing(options.results_dir, options.resume)
        info = store.read_run().model_copy(update={"ended_at": None, "interrupted": False})
        kept = [r for r in latest_per_cell(store.cells()).values() if not (options.retry_errors and r.status is Status.ERROR)]
        torn = store.torn_note()
        if torn and not options.quiet:
            warner(console)(torn)
        return store, info, kept
    suite = inputs.loaded.suite
    run_id = new_run_id(suite.suite)
    info = new_run_info(run_id=run_id, suite=suite.suite, config_path=str(inputs.loaded.path),
                        config_sha256=inputs.loaded.sha256, trigger=options.trigger, engine=suite.engine,
                        plan=inputs.plan, extraction=suite.gate.extraction, tags=dict(options.tags))
    return ResultsStore(options.results_dir, run_id), info, []


def _run_params(inputs: RunInputs, store: ResultsStore) -> dict[str, Any]:
    suite, plan = inputs.loaded.suite, inputs.plan
    return {"suite": suite.suite, "engine": suite.engine, "benchmark": plan.benchmark, "protocol": plan.name,
            "protocol_fingerprint": plan.fingerprint, "dataset_sha256": inputs.data.sha256,
            "num_questions": len(plan.prompts), "seed": suite.seed, "cells": len(inputs.matrix.cells),
            "gate_budget": run_budget(inputs).describe(), "extend_to": suite.gate.extend_to or 0,
            "results_dir": str(store.path)}


class _Schedule:
    """Runs lists of cells through one Scheduler setup; every outcome goes to the gating."""

    def __init__(self, inputs: RunInputs, gating: Gating, history: History, stop: StopRequest,
                 options: RunOptions, console: Console) -> None:
        suite = inputs.loaded.suite
        self.inputs, self.gating, self.options = inputs, gating, options
        self.durations = Durations(history.latest())
        first = failed_first(list(inputs.matrix.cells), history, suite.cluster.failed_first)
        self.order = lambda cells: priority_order(cells, self.durations, first)
        self.jobs = CellJobs(inputs, judged=gating.judged, vouching=gating.vouching_answers)
        self.scheduler = Scheduler(suite.cluster, self.durations, self.order, lambda cell: priority_class(cell, first),
                                   self.jobs, console, options.quiet, stopping=lambda: stop.requested,
                                   measured=self.jobs.notice,
                                   other_starts=lambda cells: [longest_first(cells, self.durations, first)])

    def run(self, cells: list[Cell], plan: ProtocolPlan | None = None, on_outcome: Any = None,
            label: str | None = None, looks: bool = True) -> None:
        self.jobs.queue(cells)
        self.jobs.looks = looks
        try:
            self.scheduler.run(self.order(cells), plan or self.inputs.plan, on_outcome or self._gate,
                               label or self.inputs.loaded.suite.suite)
        finally:
            self.jobs.looks = True

    def _gate(self, cell: Cell, outcome: CellOutcome, log: str, console: Console) -> None:
        self.gating.offer(cell, outcome, log)
        if self.options.fail_fast and self.gating.has_regression():
            raise _FailFast()


def run_suite(inputs: RunInputs, options: RunOptions, console: Console,
              sinks: Callable[[ResultsStore], Sinks] | None = None) -> RunReport:
    """Run every cell of `inputs.matrix` not yet judged, gate each, and write every sink
    (`sinks(store)`; default: MLflow when tracking, the results folder, the console)."""
    store, info, kept = _open(inputs, options, console)
    info = info.model_copy(update={"gate_budget": run_budget(inputs).describe()})
    suite = inputs.loaded.suite
    history = History.of(archives(options.results_dir, options.tracking_uri), suite.suite,
                         inputs.plan.fingerprint, info.run_id, suite.gate.pinned_run, suite.gate.history_runs)
    if not options.quiet:
        warn = warner(console)
        for warning in [*suite.warnings(), *([history.pinned_problem] if history.pinned_problem else [])]:
            warn(warning)
        if history.pinned_run is not None:
            how = " (auto: the first run of this protocol that was not red)" \
                if suite.gate.pinned_run == AUTO_PIN else ""
            console.print(f"pinned run: {history.pinned_run.run_id}{how}; every cell is also paired with it")
    tracker = Tracker(options.tracking_uri) if options.tracking_uri else None
    sinks = sinks(store) if sinks else standard_sinks(store, tracker, console, options.quiet)
    info = sinks.open(info, _run_params(inputs, store))
    gating = Gating(suite.gate, run_budget(inputs), inputs.plan.fingerprint, history, sinks, inputs.predicted,
                    extends=extends(inputs))
    for result in kept:
        gating.restore(result, stored_outcome(store, result.cell_id, result.args))
    preload_statistics()
    interrupted = False
    with stop_on_signals() as stop:
        schedule = _Schedule(inputs, gating, history, stop, options, console)
        planned = inputs.planned_mismatches
        for cell in inputs.matrix.cells:  # decided at plan time: no slot held, no server started
            if cell.cell_id in planned and cell.cell_id not in gating.results():
                gating.offer(cell, CellOutcome(cell_id=cell.cell_id, args=planned_argv(inputs.loaded, cell),
                                               mismatches=planned[cell.cell_id]), "")
        try:
            schedule.run([c for c in inputs.matrix.cells if c.cell_id not in gating.results() and c.cell_id not in planned])
            decide(inputs, gating, schedule.run)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
        except _FailFast:
            gating.drop_waiting()
    if not interrupted:
        gating.release_waiting()
        gating.skipped(inputs.matrix.skipped)
    return _close(inputs, info, gating, sinks, interrupted, console, options.quiet)


def _close(inputs: RunInputs, info: RunInfo, gating: Gating, sinks: Sinks, interrupted: bool, console: Console,
           quiet: bool) -> RunReport:
    cells = inputs.matrix.by_id()
    results = sorted(gating.results().values(), key=lambda r: (r.cell_id not in cells, r.cell_id))
    failing = [cells[r.cell_id].factor_values() for r in results if r.status.is_regression and r.cell_id in cells]
    # Cells held open only because their reference was named broken (Gating.name_broken_references)
    # agree with one another, and cells held open by a reference that failed a test of its own (a
    # self-check) failed none themselves: they are the contrast that points attribution at the reference.
    broken = {r.cell_id for r in results if "reference broken" in r.failed}
    regressed = {r.cell_id for r in results if r.status.is_regression}
    passing = [cells[r.cell_id].factor_values() for r in results if r.cell_id in cells and (
        r.status is Status.PASS or (r.status is Status.INCONCLUSIVE and (
            cells[r.cell_id].reference_cell in broken or (cells[r.cell_id].reference_cell in regressed and not r.failed))))]
    explanation = explain(failing, passing)
    exit_code = ExitCode.INTERRUPTED if interrupted else run_exit_code([r.status for r in results])
    info = closed_run_info(info, results, exit_code, interrupted=interrupted,
                           attribution=str(explanation) if explanation else None)
    info = sinks.close(info, results)
    if info.results_error and not interrupted:  # verdicts stand, but the run's record is not where it belongs
        exit_code = ExitCode.UNDECIDED
    if interrupted and not quiet:
        console.print(f"[yellow]interrupted[/]: finish with `regress run {inputs.loaded.path} --resume {info.run_id}`")
    answers = {cell_id: outcome for cell_id in cells if (outcome := gating.answers(cell_id)) is not None}
    return RunReport(info, results, answers, exit_code)
