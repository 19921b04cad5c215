"""The driver: one run from its config to every sink; each cell gated as it finishes.

The scheduler (`scheduler`) keeps the GPUs busy; the driver decides what it runs and in which
priority (`packing.priority_order`): recent failures first when `cluster.failed_first`, each
reference cell ahead of the cells compared with it (a cell that finishes before its reference
waits for it to be judged), then by width and learned duration. Ctrl-C or SIGTERM kills every
slot (their servers die with them), keeps the finished cells, and leaves a run that `--resume`
completes.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from harness import __version__
from harness.engine.launch import LaunchSpec, default_python
from harness.gate.attribution import explain
from harness.gate.sequential import EarlyStop
from harness.gate.stats import preload as preload_statistics
from harness.gate.verdict import judge
from harness.gsm8k.dataset import Gsm8k
from harness.gsm8k.evaluator import EvalSettings, score
from harness.gsm8k.protocol import ProtocolPlan
from harness.results.assemble import cell_result, close_run, sink_cell
from harness.results.records import CellOutcome, CellResult, RunInfo, Status, run_exit_code
from harness.results.reporting import print_summary
from harness.results.store import ResultsStore, new_run_id
from harness.results.tracking import Tracker
from harness.run.ray.cluster import engine_env
from harness.run.ray.scheduler import Interrupted, OnOutcome, Scheduler
from harness.run.ray.worker import CellJob
from harness.run.scheduling.durations import Durations
from harness.run.scheduling.placement import priority_class, priority_order
from harness.suite.config import LoadedSuite
from harness.suite.matrix import Cell, Matrix


@dataclass
class RunOptions:
    results_dir: Path
    tracking_uri: str | None
    ray_address: str | None = None
    trigger: str = "manual"
    resume: str | None = None
    retry_errors: bool = False
    fail_fast: bool = False
    quiet: bool = False
    extra_tags: dict[str, str] = field(default_factory=dict)


class _FailFast(BaseException):
    """A confirmed regression under --fail-fast: stop scheduling, keep what finished."""


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None


def stored_outcome(store: ResultsStore, cell_id: str, args: list[str] | None = None) -> CellOutcome | None:
    """A cell's answers in a finished run, as an outcome the gate can pair with (None: no answers)."""
    records = store.read_questions(cell_id)
    if not records:
        return None
    return CellOutcome(cell_id=cell_id, args=args or [], score=score(records, 0.0), questions=records)


class Driver:
    """One invocation of `regress run`."""

    def __init__(self, suite: LoadedSuite, matrix: Matrix, data: Gsm8k, plan: ProtocolPlan,
                 options: RunOptions, console: Console | None = None) -> None:
        self.loaded = suite
        self.suite = suite.suite
        self.matrix = matrix
        self.data = data
        self.plan = plan
        self.options = options
        self.console = console or Console()
        self.cells = matrix.by_id()
        self.finished: dict[str, CellOutcome] = {}
        self.parked: dict[str, list[tuple[Cell, CellOutcome, str]]] = {}
        self.results: dict[str, CellResult] = {}
        self.queued_at: dict[str, float] = {}
        self.history: ResultsStore | None = None
        self.history_cells: dict[str, CellResult] = {}
        self.durations = Durations()
        self.stop_signal: int | None = None  # SIGTERM or SIGINT received: stop at the next check

    # ---- setup -------------------------------------------------------------------------------
    def _open_store(self) -> tuple[ResultsStore, RunInfo]:
        if self.options.resume:
            store = ResultsStore.existing(self.options.results_dir, self.options.resume)
            info = store.read_run()
            for result in store.cells():
                if self.options.retry_errors and result.status is Status.ERROR:
                    self.results.pop(result.cell_id, None)  # a later line for the cell replaces this one
                    continue
                self.results[result.cell_id] = result
                if result.status in (Status.PASS, Status.FAIL, Status.INCONCLUSIVE):
                    outcome = stored_outcome(store, result.cell_id, result.args)
                    if outcome is not None:
                        self.finished[result.cell_id] = outcome
            return store, info.model_copy(update={"ended_at": None, "interrupted": False})
        run_id = new_run_id(self.suite.suite)
        store = ResultsStore(self.options.results_dir, run_id)
        info = RunInfo(run_id=run_id, suite=self.suite.suite, config_path=str(self.loaded.path),
                       config_sha256=self.loaded.sha256, trigger=self.options.trigger, engine=self.suite.engine,
                       git_commit=git_commit(), harness_version=__version__, protocol=self.plan.name,
                       protocol_fingerprint=self.plan.fingerprint, dataset_sha256=self.data.sha256,
                       started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        return store, info

    def _launch_spec(self, cell: Cell) -> LaunchSpec:
        return LaunchSpec(engine=self.suite.engine, python=default_python(self.suite.python), cell=cell,
                          seed=self.suite.seed, startup_timeout_s=cell.model.startup_timeout_s,
                          env=engine_env(self.loaded, self.data.source), stop_grace_s=self.suite.stop_grace_s)

    def _settings(self) -> EvalSettings:
        return EvalSettings(concurrency=self.suite.concurrency, request_timeout_s=self.suite.request_timeout_s,
                            max_attempts=self.suite.request_attempts, model_name="default")

    def _find_history(self, current_run_id: str) -> ResultsStore | None:
        """The latest earlier run of this suite with the same protocol fingerprint."""
        from harness.analysis.compare import runs_of

        for info in reversed(runs_of(self.options.results_dir, self.suite.suite)):
            if info.run_id != current_run_id and info.protocol_fingerprint == self.plan.fingerprint:
                return ResultsStore(self.options.results_dir, info.run_id)
        return None

    def _history_outcome(self, cell_id: str) -> CellOutcome | None:
        """The same cell's answers in the history run, when it passed there."""
        if self.history is None:
            return None
        previous = self.history_cells.get(cell_id)
        if previous is None or previous.status is not Status.PASS:
            return None
        return stored_outcome(self.history, cell_id)

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> tuple[RunInfo, list[CellResult], int]:
        store, info = self._open_store()
        store.write_run(info)
        self.history = self._find_history(info.run_id)
        self.history_cells = {c.cell_id: c for c in self.history.cells()} if self.history else {}
        self.durations = Durations(list(self.history_cells.values()))
        tracker = Tracker(self.options.tracking_uri) if self.options.tracking_uri else None
        if tracker is not None:
            params = {"suite": self.suite.suite, "engine": self.suite.engine, "protocol": self.plan.name,
                      "protocol_fingerprint": self.plan.fingerprint, "dataset_sha256": self.data.sha256,
                      "num_questions": len(self.plan.prompts), "seed": self.suite.seed,
                      "cells": len(self.matrix.cells), "results_dir": str(store.path)}
            info = info.model_copy(update={"mlflow_run_id": tracker.start(info, params),
                                           "mlflow_experiment_id": tracker.experiment_id,
                                           "tracking_uri": self.options.tracking_uri})
            store.write_run(info)
        todo = [c for c in self.matrix.cells if c.cell_id not in self.results]
        preload_statistics()
        interrupted = False
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        if threading.current_thread() is not threading.main_thread():
            previous = {}  # signals reach only the main thread; an embedding caller handles them
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            self._schedule(self.order(todo), store, tracker)
            if self.suite.gate.extend_to:
                self._extend(store, tracker)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
        except _FailFast:
            self.parked.clear()  # cells waiting for their reference are not judged; --resume runs them
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if not interrupted:
            for parked in list(self.parked.values()):  # references that never produced a score
                for cell, outcome, log in parked:
                    self._finalise(cell, outcome, log, store, tracker, reference_missing=True)
            self.parked.clear()
            for skipped in self.matrix.skipped:
                if skipped.cell_id not in self.results:
                    result = CellResult(cell_id=skipped.cell_id, model=skipped.model.id, factors=skipped.factors,
                                        args=[], resolved={}, status=Status.SKIPPED, reason=skipped.reason)
                    store.append_cell(result)
                    self.results[skipped.cell_id] = result
        return self._close(store, info, tracker, interrupted)

    def _first(self) -> set[str]:
        """Cells that failed in the history run and their references, when `cluster.failed_first`
        runs them before the rest."""
        if not self.suite.cluster.failed_first:
            return set()
        failed = {cell_id for cell_id, result in self.history_cells.items() if result.status.is_regression}
        references = {self.cells[cell_id].reference_cell for cell_id in failed if cell_id in self.cells}
        return failed | {reference for reference in references if reference is not None}

    def order(self, cells: list[Cell]) -> list[Cell]:
        """The queue's priority order (see `packing.priority_order`)."""
        return priority_order(cells, self.durations, self._first())

    def _priority_class(self, cell: Cell) -> int:
        return priority_class(cell, self._first())

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only a flag: an exception raised here could surface inside Ray's C++ wait as a
        # SystemError. The scheduling loop checks the flag twice a second. A second signal stops now.
        if self.stop_signal is not None:
            raise KeyboardInterrupt
        self.stop_signal = signum

    def _early_stop(self, cell: Cell) -> EarlyStop | None:
        gate = self.suite.gate
        if gate.early_stop_alpha <= 0:
            return None
        return EarlyStop(cell.model.floor, len(self.plan.prompts), gate.early_stop_alpha, gate.extraction)

    def _job(self, cell: Cell, devices: tuple[str, ...]) -> CellJob:
        return CellJob(spec=replace(self._launch_spec(cell), devices=devices), settings=self._settings(),
                       queued_at=self.queued_at[cell.cell_id], stall_timeout_s=self.suite.stall_timeout_s,
                       early_stop=self._early_stop(cell))

    def _schedule(self, todo: list[Cell], store: ResultsStore, tracker: Tracker | None,
                  plan: ProtocolPlan | None = None, on_outcome: OnOutcome | None = None,
                  label: str | None = None) -> None:
        """Run `todo` (in priority order); each outcome goes to `on_outcome` (default: gate it and write it)."""
        if on_outcome is None:
            def on_outcome(cell: Cell, outcome: CellOutcome, log: str, console: Console) -> None:
                self._gate_when_ready(cell, outcome, log, store, tracker, console)
        for cell in todo:
            self.queued_at.setdefault(cell.cell_id, time.time())
        scheduler = Scheduler(self.suite.cluster, self.durations, self.order, self._priority_class, self._job,
                              self.console, self.options.quiet, stopping=lambda: self.stop_signal is not None)
        scheduler.run(todo, plan or self.plan, on_outcome, label or self.suite.suite)

    def _extend(self, store: ResultsStore, tracker: Tracker | None) -> None:
        """Ask `inconclusive` cells (and their references) more questions from the train split,
        up to `gate.extend_to` in all, and judge them again on everything they answered."""
        from harness.gsm8k.protocol import extension_plan

        undecided = [self.cells[r.cell_id] for r in self.results.values()
                     if r.status is Status.INCONCLUSIVE and r.cell_id in self.cells and r.cell_id in self.finished]
        if not undecided:
            return
        extra = extension_plan(self.data, self.plan, self.suite.gate.extend_to - len(self.plan.prompts))
        if extra is None:
            return
        wanted = {c.cell_id for c in undecided} | {c.reference_cell for c in undecided if c.reference_cell}
        cells = [self.cells[cell_id] for cell_id in wanted if cell_id in self.finished]
        more: dict[str, CellOutcome] = {}

        def collect(cell: Cell, outcome: CellOutcome, log: str, console: Console) -> None:
            more[cell.cell_id] = outcome

        self._schedule(self.order(cells), store, tracker, plan=extra, on_outcome=collect,
                       label=f"{self.suite.suite}: extending {len(undecided)} inconclusive cell(s)")
        for cell_id, outcome in more.items():
            if outcome.score is None or outcome.error:
                continue
            base = self.finished[cell_id]
            records = [*base.questions, *outcome.questions]
            self.finished[cell_id] = base.model_copy(update={"questions": records,
                                                             "score": score(records, base.score.eval_s + outcome.score.eval_s)})
        for cell in undecided:
            self._finalise(cell, self.finished[cell.cell_id], "", store, tracker, console=self.console,
                           note="extended to {n} questions; ")

    def _gate_when_ready(self, cell: Cell, outcome: CellOutcome, log: str, store: ResultsStore,
                         tracker: Tracker | None, console: Console) -> None:
        reference = cell.reference_cell
        if reference is not None and reference not in self.results:
            self.parked.setdefault(reference, []).append((cell, outcome, log))
            return
        self._finalise(cell, outcome, log, store, tracker, console=console)
        for waiting_cell, waiting_outcome, waiting_log in self.parked.pop(cell.cell_id, []):
            self._finalise(waiting_cell, waiting_outcome, waiting_log, store, tracker, console=console)
        if self.options.fail_fast and any(r.status.is_regression for r in self.results.values()):
            raise _FailFast()

    def _finalise(self, cell: Cell, outcome: CellOutcome, log: str, store: ResultsStore, tracker: Tracker | None,
                  console: Console | None = None, reference_missing: bool = False, note: str = "") -> None:
        """Judge one cell and write it everywhere. Judging a cell again (after an extension) appends
        a line that replaces the earlier one; `note` ({n} = questions) leads its reason."""
        if outcome.score is not None and outcome.error is None:
            self.finished[cell.cell_id] = outcome
        reference = None if reference_missing or cell.reference_cell is None else self.finished.get(cell.reference_cell)
        history = self._history_outcome(cell.cell_id)
        verdict = judge(outcome, cell.model.floor, self.suite.gate, len(self.matrix.cells), reference, history)
        if note:
            verdict = replace(verdict, reason=note.format(n=verdict.n) + verdict.reason)
        earlier = self.results.get(cell.cell_id)
        log_path = store.write_log(cell.cell_id, log) if log else (
            Path(earlier.log_path) if earlier is not None and earlier.log_path else None)
        result = cell_result(cell_id=cell.cell_id, model=cell.model.id, factors=cell.factors,
                             reference_cell=cell.reference_cell, floor=cell.model.floor, outcome=outcome,
                             verdict=verdict, fingerprint=self.plan.fingerprint, log_path=log_path,
                             history_run_id=self.history.run_id if self.history else None)
        result = sink_cell(store, tracker, result, outcome, log)
        self.results[cell.cell_id] = result
        if console is not None and not self.options.quiet:
            accuracy = f"{result.accuracy:.3f}" if result.accuracy is not None else "  -  "
            detail = ""
            if result.status is not Status.PASS:
                detail = "  " + (" ".join(f"{name} p={value:.1g}" for name, value in (
                    ("floor", result.floor_p), ("vs ref", result.mcnemar_p)) if value is not None)
                    or result.reason.splitlines()[0][:100])
            console.print(f"[{result.status.colour}]{result.status.value:>12}[/] {accuracy} {cell.cell_id}{detail}")

    def _close(self, store: ResultsStore, info: RunInfo, tracker: Tracker | None,
               interrupted: bool) -> tuple[RunInfo, list[CellResult], int]:
        order = {cell.cell_id: i for i, cell in enumerate(sorted(self.matrix.cells, key=lambda c: c.cell_id))}
        results = sorted(self.results.values(), key=lambda r: order.get(r.cell_id, len(order)))
        failing = [self.cells[r.cell_id].factor_values() for r in results
                   if r.status.is_regression and r.cell_id in self.cells]
        passing = [self.cells[r.cell_id].factor_values() for r in results
                   if r.status is Status.PASS and r.cell_id in self.cells]
        explanation = explain(failing, passing)
        exit_code = 130 if interrupted else run_exit_code([r.status for r in results])
        info = close_run(store, info, results, tracker, exit_code, interrupted=interrupted,
                         attribution=str(explanation) if explanation else None)
        if not self.options.quiet:
            print_summary(self.console, info, results, str(store.path))
            if interrupted:
                self.console.print(f"[yellow]interrupted[/]: finish with `regress run {self.loaded.path} "
                                   f"--resume {info.run_id}`")
        return info, results, exit_code
