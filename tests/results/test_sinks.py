"""Sinks: a run talks to one chain of them, so a new destination is one class. A toy sink passed
to a real (simulated) run sees every judged cell and the close, in order, after the results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from harness.benchmark.gsm8k.protocol import build_plan
from harness.records import CellResult, RunInfo, Status
from harness.results.sinks import FinishedCell, FolderSink, Sinks, standard_sinks
from harness.results.store import ResultsStore
from harness.run.build import RunInputs
from harness.run.pipeline import RunOptions, run_suite
from harness.suite.config import load_suite
from harness.suite.matrix import expand, select
from tests import records
from tests.helpers import ROOT


class PullRequestComment:
    """A toy sink: collects the lines a PR comment would have."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.opened: RunInfo | None = None
        self.closed: RunInfo | None = None

    def open(self, info: RunInfo, params: dict[str, Any]) -> RunInfo:
        self.opened = info
        return info

    def cell(self, finished: FinishedCell) -> CellResult:
        self.lines.append(f"{finished.result.status.value} {finished.result.cell_id} n={len(finished.questions)}")
        return finished.result

    def close(self, info: RunInfo, results: list[CellResult]) -> RunInfo:
        self.closed = info
        self.lines.append(f"{len(results)} cells, exit {info.exit_code}")
        return info


def test_a_toy_sink_sees_every_cell_and_the_close_of_a_real_run(ray_local, gsm8k, tmp_path):
    loaded = load_suite(ROOT / "configs" / "demo.yaml")
    quick = {"num_questions": 20, "gate": loaded.suite.gate.model_copy(update={"extend_to": None})}
    loaded = loaded.model_copy(update={"suite": loaded.suite.model_copy(update=quick)})
    matrix = select(expand(loaded.suite), "model=deepseek-v2-lite,attention_backend=triton|fa3,radix_cache=on")
    plan = build_plan(gsm8k, loaded.suite.protocol, 20, 0)
    options = RunOptions(results_dir=tmp_path, tracking_uri=None, quiet=True)
    comment = PullRequestComment()

    def sinks_for(store: ResultsStore) -> Sinks:
        return Sinks([*standard_sinks(store, None, None).sinks, comment])

    report = run_suite(RunInputs(loaded, matrix, gsm8k, plan), options, Console(quiet=True), sinks=sinks_for)
    assert comment.opened is not None and comment.opened.run_id == report.info.run_id
    assert sorted(comment.lines[:-1]) == sorted(f"{r.status.value} {r.cell_id} n=20" for r in report.results), \
        [r.reason for r in report.results]
    assert comment.lines[-1] == f"4 cells, exit {report.exit_code}" and comment.closed.counts == report.info.counts
    written = ResultsStore(tmp_path, report.info.run_id).cells()
    assert sorted(r.cell_id for r in written) == sorted(c.cell_id for c in matrix.cells)
    assert {r.cell_id: r.status for r in written} == {r.cell_id: r.status for r in report.results}


def test_the_folder_sink_writes_questions_log_and_line_and_records_the_log_path(tmp_path):
    store = ResultsStore(tmp_path, "t-1")
    result = records.result("c", Status.PASS, reason="ok")
    written = FolderSink(store).cell(FinishedCell(result, [], {}, "server log\n"))
    assert written.log_path == str(tmp_path / "t-1" / "logs" / "c.log")
    assert Path(written.log_path).read_text() == "server log\n"
    assert store.cells() == [written] and (tmp_path / "t-1" / "questions" / "c.jsonl").exists()


def test_when_neither_disk_takes_the_cells_run_json_says_so_and_the_error_is_no_traceback(tmp_path, monkeypatch):
    """Results folder and rescue folder both full: the sink returns the run with `results_error` naming
    both, and raises nothing (the run still prints its verdicts, then exits 3)."""
    import errno

    from harness.results import store as store_module

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    store = ResultsStore(tmp_path / "results", "t-1")
    sink = FolderSink(store, rescue_root=tmp_path / "rescue")
    sink.open(records.run_info("t-1"), {})
    monkeypatch.setattr(store_module, "atomic_write", full)
    result = records.result("c", Status.PASS, reason="ok")
    assert sink.cell(FinishedCell(result, [], {}, "")) == result and len(sink.unwritten) == 1
    info = sink.close(records.run_info("t-1"), [result])
    assert "nor to" in info.results_error and str(tmp_path / "rescue" / "t-1") in info.results_error
    assert store.cells() == []


def test_an_oserror_that_is_not_the_disk_is_a_bug_and_propagates(tmp_path, monkeypatch):
    import errno

    import pytest

    from harness.results import store as store_module

    def denied(path, text):
        raise OSError(errno.EACCES, "Permission denied", str(path))

    sink = FolderSink(ResultsStore(tmp_path, "t-1"), rescue_root=tmp_path / "rescue")
    monkeypatch.setattr(store_module, "atomic_write", denied)
    with pytest.raises(PermissionError):
        sink.cell(FinishedCell(records.result("c", Status.PASS, reason="ok"), [], {}, ""))
