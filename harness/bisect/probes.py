"""Running bisect probes: each is a one-cell run on one commit's build, built as `regress run`
builds its run (`harness.run.build`: the engine's check, `auto` backends, the data path) and run
through the same pipeline."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.bisect.search import BisectResult, bisect_commits
from harness.engine.engines import engine_of
from harness.errors import ConfigError, ProbeError
from harness.gate.budget import Budget
from harness.gate.verdict import Stage, judge
from harness.records import CellOutcome, Status
from harness.results.reporting import warner
from harness.run.build import RunRequest, cluster_matrix, plan_check, prepare
from harness.run.pipeline import RunOptions, run_suite
from harness.run.ray.cluster import check_fits, ray_cluster
from harness.suite.matrix import Matrix


@dataclass(frozen=True)
class BisectRequest:
    run: RunRequest  # the suite, data path and question count every probe's run is built from
    cell_id: str
    good: str
    bad: str
    repo: Path | None  # the sglang checkout the commits come from (engine sglang)
    build: str  # a pip requirement of one commit's build, `{commit}` replaced


def run_bisect(request: BisectRequest, results_dir: Path, console: Console) -> BisectResult:
    inputs = prepare(request.run)
    engine = engine_of(inputs.loaded)
    commits = engine.commits(inputs.loaded, request.good, request.bad, request.repo)
    spec = inputs.loaded.suite
    warn = warner(console)

    with ray_cluster(inputs.loaded, None):
        # The matrix as a run sees it (`auto` backends as the workers' engine accepts them).
        cells = cluster_matrix(inputs, request.run).by_id()
        if request.cell_id not in cells:
            raise ConfigError(f"--cell {request.cell_id}: not a cell of {request.run.suite_path}; `regress plan` lists them")
        cell = cells[request.cell_id]
        check_fits(Matrix((cell,)), spec.cluster.slot_resource)

        def run_probe(commit: str) -> CellOutcome:
            probe_loaded, probe_cell = engine.at_commit(inputs.loaded, cell, commit, request.build)
            probe = plan_check(replace(inputs, loaded=probe_loaded, matrix=Matrix((probe_cell,)), predicted={}), warn)
            report = run_suite(probe, RunOptions(results_dir=results_dir, tracking_uri=None, trigger=f"bisect:{commit}",
                                                 quiet=True), console)
            outcome = report.answers.get(request.cell_id)
            if outcome is None:
                result = next(r for r in report.results if r.cell_id == request.cell_id)
                raise ProbeError(f"commit {commit} could not be measured: {result.reason}")
            return outcome

        def judge_probe(outcome: CellOutcome, reference: CellOutcome) -> tuple[bool, str, float | None]:
            # The good commit's answers are the same cell's, as a history run's: a drop beyond gate.history_margin counts.
            stage = Stage(alpha=Budget(spec.gate.alpha, 1, early_stop_share=0.0).stage(1))
            verdict = judge(outcome, cell.model.floor, spec.gate, stage, history=reference)
            if verdict.status is Status.ERROR:
                raise ProbeError(f"a probe could not be measured: {verdict.reason}")
            return verdict.status is Status.FAIL, verdict.reason, verdict.accuracy

        console.print(f"bisecting {request.cell_id} over {len(commits)} commits ({request.good}..{request.bad})")
        result = bisect_commits(commits, run_probe, judge_probe)
    table = Table(title=f"probes of {request.cell_id}", header_style="bold")
    for column in ("commit", "accuracy", "verdict", "why"):
        table.add_column(column)
    for probe in result.probes:
        table.add_row(probe.commit, "-" if probe.accuracy is None else f"{probe.accuracy:.3f}",
                      "[red]bad[/]" if probe.bad else "[green]good[/]", probe.reason[:120])
    console.print(table)
    return result
