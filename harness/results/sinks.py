"""Where finished cells and runs go: the results folder, MLflow, the console, and anything else that
implements `Sink`. A run talks to one `Sinks` chain and never to a store directly, so adding a sink
(a database, a PR comment) is one class.

The chain's order matters and is fixed by `standard_sinks`: MLflow first (it gives the cell its
MLflow run id), then the results folder (its cells.jsonl line records that id), then the console.
Each sink returns the record as it leaves it, and the next one sees that.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape

from harness.errors import DISK_ERRNOS
from harness.records import CellResult, QuestionRecord, RunInfo, Status
from harness.results.mlflow_layout import CELLS_ARTIFACT
from harness.results.reporting import junit_xml, print_summary, summary_markdown
from harness.results.store import ResultsStore
from harness.results.tracker_process import TrackerProcess
from harness.results.tracking import Tracker


@dataclass(frozen=True)
class FinishedCell:
    """A judged cell with what it was judged on: what every sink may want to keep."""

    result: CellResult
    questions: list[QuestionRecord] = field(default_factory=list)
    server_info: dict[str, Any] = field(default_factory=dict)
    log: str = ""


class Sink(Protocol):
    """One destination of results. Each method returns its input as this sink leaves it."""

    def open(self, info: RunInfo, params: dict[str, Any]) -> RunInfo: ...

    def cell(self, finished: FinishedCell) -> CellResult: ...

    def close(self, info: RunInfo, results: list[CellResult]) -> RunInfo: ...


class Sinks:
    """Sinks in order; each sees what the ones before it returned."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = list(sinks)

    def prepare(self, info: RunInfo) -> None:
        """Work a sink may start before the run's results exist (import a client, connect to a store);
        optional (`prepare(info)` on the sink). A sink that must not slow the caller down does it
        elsewhere (an MlflowSink over a `TrackerProcess` starts its process and returns at once)."""
        for sink in self.sinks:
            prepare = getattr(sink, "prepare", None)
            if prepare is not None:
                prepare(info)

    def open(self, info: RunInfo, params: dict[str, Any] | None = None) -> RunInfo:
        for sink in self.sinks:
            info = sink.open(info, params or {})
        return info

    def cell(self, finished: FinishedCell) -> CellResult:
        result = finished.result
        for sink in self.sinks:
            result = sink.cell(FinishedCell(result, finished.questions, finished.server_info, finished.log))
        return result

    def close(self, info: RunInfo, results: list[CellResult]) -> RunInfo:
        for sink in self.sinks:
            info = sink.close(info, results)
        return info


class FolderSink:
    """`results/<run_id>/`: run.json, cells.jsonl, questions/, logs/, summary.md, junit.xml.

    A disk that fills up (or goes read-only) mid-run costs no answers: the cells that could not be
    written are kept in memory and written again before every later cell and at the close (space may
    have been freed meanwhile); what still cannot be written at the close goes, as a run folder of its
    own, under `rescue_root` (another disk, by default the system's temporary folder), and run.json's
    `results_error` says so. Other OSErrors are bugs and propagate.
    """

    def __init__(self, store: ResultsStore, rescue_root: Path | None = None) -> None:
        self.store = store
        self.rescue_root = rescue_root if rescue_root is not None else default_rescue_root()
        self.unwritten: list[FinishedCell] = []  # judged cells the disk refused, oldest first
        self.error: OSError | None = None  # the first disk error, if any

    def open(self, info: RunInfo, params: dict[str, Any]) -> RunInfo:
        self.store.write_run(info)
        return info

    def cell(self, finished: FinishedCell) -> CellResult:
        self.unwritten.append(finished)
        written = self._flush()
        if self.unwritten:  # the disk refused (at least) this one: kept, its log_path set once written
            return finished.result
        return written[-1]

    def _flush(self) -> list[CellResult]:
        """Write the kept cells in order, stopping at the first disk error (the rest stay kept);
        returns the results written, as written."""
        written: list[CellResult] = []
        while self.unwritten:
            try:
                written.append(self._write(self.unwritten[0]))
            except OSError as error:
                if error.errno not in DISK_ERRNOS:
                    raise
                self.error = self.error or error
                break
            self.unwritten.pop(0)
        return written

    def _write(self, finished: FinishedCell, store: ResultsStore | None = None) -> CellResult:
        store = store or self.store
        result = finished.result
        if result.status is not Status.SKIPPED:
            store.write_questions(result.cell_id, finished.questions)
        if finished.log:
            result = result.model_copy(update={"log_path": str(store.write_log(result.cell_id, finished.log))})
        store.append_cell(result)
        return result

    def close(self, info: RunInfo, results: list[CellResult]) -> RunInfo:
        self._flush()
        if not self.unwritten:
            try:
                self._write_summaries(self.store, info, results)
                return info
            except OSError as error:
                if error.errno not in DISK_ERRNOS:
                    raise
                self.error = self.error or error
        return self._rescue(info, results, self.error or OSError("the results folder refused a write"))

    def _write_summaries(self, store: ResultsStore, info: RunInfo, results: list[CellResult]) -> None:
        store.write_text("summary.md", summary_markdown(info, results))
        store.write_text("junit.xml", junit_xml(info, results))
        store.write_run(info)

    def _rescue(self, info: RunInfo, results: list[CellResult], error: OSError) -> RunInfo:
        """The cells the results folder could not take, written as a run folder under rescue_root."""
        rescue = ResultsStore(self.rescue_root, self.store.run_id)
        kept = len(self.unwritten)
        if kept:
            what = f"{kept} judged cell{'s' * (kept != 1)} (answers and logs)"
            merge = (f"append its cells.jsonl to the run's and copy questions/ and logs/ over, then "
                     f"`regress run SUITE --resume {self.store.run_id}` runs what is missing")
        else:
            what, merge = "its run.json and summaries", "every cell is in the run's cells.jsonl"
        info = info.model_copy(update={"results_error": (
            f"{_disk_error(error)}: {what} could not be written to {self.store.path}; written instead to "
            f"{rescue.path}: {merge}")})
        try:
            for finished in self.unwritten:
                self._write(finished, rescue)
            self._write_summaries(rescue, info, results)
        except OSError as second:
            if second.errno not in DISK_ERRNOS:
                raise
            info = info.model_copy(update={"results_error": (
                f"{_disk_error(error)}: {what} could not be written to {self.store.path}, nor to {rescue.path} "
                f"({second.strerror}); MLflow has what it logged, the console what it printed")})
        return info


def default_rescue_root() -> Path:
    """Where a full results disk's cells go: REGRESS_RESCUE_DIR, else `<tmp>/regress-rescue`."""
    return Path(os.environ.get("REGRESS_RESCUE_DIR") or Path(tempfile.gettempdir()) / "regress-rescue")


def _disk_error(error: OSError) -> str:
    return error.strerror or str(error)


class MlflowSink:
    """A parent run per invocation and a child run per cell; never fails a run (see `Tracker`).
    The tracker is a `Tracker` (MLflow in this process) or a `TrackerProcess` (MLflow in a process
    of its own, for a caller whose own process has latency-bound work meanwhile: `regress eval`
    sending questions)."""

    def __init__(self, tracker: Tracker | TrackerProcess) -> None:
        self.tracking_uri = tracker.tracking_uri
        self.tracker = tracker

    def prepare(self, info: RunInfo) -> None:
        self.tracker.connect(info.suite)  # MLflow's import and the store's opening: seconds of CPU

    def open(self, info: RunInfo, params: dict[str, Any]) -> RunInfo:
        parent = self.tracker.start(info, params)
        return info.model_copy(update={"mlflow_run_id": parent, "mlflow_experiment_id": self.tracker.experiment_id,
                                       "tracking_uri": self.tracking_uri, "tracking_error": self.tracker.error})

    def cell(self, finished: FinishedCell) -> CellResult:
        if finished.result.status is Status.SKIPPED:  # excluded by a rule: nothing was run
            return finished.result
        run_id = self.tracker.log_cell(finished.result, finished.questions, finished.server_info, finished.log)
        return finished.result.model_copy(update={"mlflow_run_id": run_id})

    def close(self, info: RunInfo, results: list[CellResult]) -> RunInfo:
        # cells.jsonl on the parent run: what a clean CI runner reads back as history (see archive).
        self.tracker.finish(info, {"summary.md": summary_markdown(info, results),
                                   CELLS_ARTIFACT: "".join(r.model_dump_json() + "\n" for r in results)})
        self.tracker.close()
        return info.model_copy(update={"tracking_error": self.tracker.error})


class ConsoleSink:
    """A line per finished cell as it comes, then the table, the attribution and where results are."""

    def __init__(self, console: Console, results_path: Path, quiet: bool = False) -> None:
        self.console = console
        self.results_path = results_path
        self.quiet = quiet

    def open(self, info: RunInfo, params: dict[str, Any]) -> RunInfo:
        return info

    def cell(self, finished: FinishedCell) -> CellResult:
        result = finished.result
        if not self.quiet and result.status is not Status.SKIPPED:
            self.console.print(cell_line(result))
        return result

    def close(self, info: RunInfo, results: list[CellResult]) -> RunInfo:
        if not self.quiet:
            print_summary(self.console, info, results, str(self.results_path))
        elif info.results_error:  # the one line a quiet run still owes: why it exits 3
            self.console.print(f"[bold red]error[/]: results not all written: {escape(info.results_error)}",
                               soft_wrap=True)
        return info


def cell_line(result: CellResult) -> str:
    """`        fail 0.200 kimi-linear.ab-fa3.um-on.rc-on  floor p=2e-10 vs ref p=0.0001`"""
    accuracy = f"{result.accuracy:.3f}" if result.accuracy is not None else "  -  "
    detail = ""
    if result.status is not Status.PASS:
        detail = "  " + (" ".join(f"{name} p={value:.1g}" for name, value in (
            ("floor", result.floor_p), ("vs ref", result.mcnemar_p), ("diverged", result.divergence_p))
            if value is not None)
            or result.reason.splitlines()[0][:100])
    return f"[{result.status.colour}]{result.status.value:>12}[/] {accuracy} {result.cell_id}{detail}"


def standard_sinks(store: ResultsStore, tracker: Tracker | TrackerProcess | None, console: Console | None,
                   quiet: bool = False) -> Sinks:
    """MLflow through `tracker` (None: no tracking), the results folder, and the console (unless None)."""
    chain: list[Sink] = []
    if tracker is not None:
        chain.append(MlflowSink(tracker))
    chain.append(FolderSink(store))
    if console is not None:
        chain.append(ConsoleSink(console, store.path, quiet))
    return Sinks(chain)
