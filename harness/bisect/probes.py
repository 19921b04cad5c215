"""Running bisect probes: each is a one-cell run through the normal driver on one commit's build."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.bisect.search import BisectResult, bisect_commits
from harness.errors import ConfigError, ProbeError
from harness.gate.budget import Budget
from harness.gate.verdict import Stage, judge
from harness.gsm8k.dataset import load_gsm8k
from harness.gsm8k.protocol import build_plan
from harness.records import CellOutcome, Status
from harness.run.pipeline import RunInputs, RunOptions, run_suite
from harness.run.ray.cluster import check_fits, ray_cluster
from harness.sim.world import load_world
from harness.suite.config import LoadedSuite, load_suite
from harness.suite.matrix import Cell, Matrix, expand


def commit_list(loaded: LoadedSuite, good: str, bad: str, repo: Path | None) -> list[str]:
    if loaded.suite.engine == "sim":
        assert loaded.suite.sim_world is not None
        history = load_world(loaded.resolve_path(loaded.suite.sim_world)).history
        if good not in history or bad not in history:
            raise ConfigError(f"--good/--bad: both must be in the simulator world's history ({len(history)} commits)")
        return history[history.index(good):history.index(bad) + 1]
    if repo is None:
        raise ConfigError("--repo: the sglang checkout to list commits from is required with the sglang engine")
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-list", "--reverse", "--first-parent", f"{good}..{bad}"],
                             capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise ConfigError(f"git rev-list {good}..{bad} failed in {repo}: {getattr(error, 'stderr', error)}") from None
    return [good, *out.stdout.split()]


def _probe_suite(loaded: LoadedSuite, cell: Cell, commit: str, build: str) -> tuple[LoadedSuite, Cell]:
    spec = loaded.suite
    if spec.engine == "sim":
        model = cell.model.model_copy(update={"env": {**cell.model.env, "REGRESS_SIM_COMMIT": commit}})
        probe_cell = Cell(cell.cell_id, model, cell.factors, cell.flags, cell.expected, None)
        return loaded, probe_cell
    runtime_env = {**spec.cluster.runtime_env, "pip": [build.format(commit=commit)]}
    cluster = spec.cluster.model_copy(update={"runtime_env": runtime_env})
    probe_loaded = loaded.model_copy(update={"suite": spec.model_copy(update={"cluster": cluster})})
    return probe_loaded, Cell(cell.cell_id, cell.model, cell.factors, cell.flags, cell.expected, None)


def run_bisect(suite_path: Path, cell_id: str, good: str, bad: str, repo: Path | None, build: str,
               num_questions: int | None, results_dir: Path, console: Console) -> BisectResult:
    loaded = load_suite(suite_path)
    # A probe is judged here, against the good commit's answers on the planned questions: the run
    # that measures it never extends.
    updates: dict = {"gate": loaded.suite.gate.model_copy(update={"extend_to": None})}
    if num_questions is not None:
        updates["num_questions"] = num_questions
    loaded = loaded.model_copy(update={"suite": loaded.suite.model_copy(update=updates)})
    cells = expand(loaded.suite).by_id()
    if cell_id not in cells:
        raise ConfigError(f"--cell {cell_id}: not a cell of {suite_path}; `regress plan` lists them")
    commits = commit_list(loaded, good, bad, repo)
    data = load_gsm8k(loaded.resolve_path(loaded.suite.dataset.path) if loaded.suite.dataset.path else None)
    spec = loaded.suite
    plan = build_plan(data, spec.protocol, spec.num_questions, spec.seed, spec.max_tokens)

    def run_probe(commit: str) -> CellOutcome:
        probe_loaded, probe_cell = _probe_suite(loaded, cells[cell_id], commit, build)
        report = run_suite(RunInputs(probe_loaded, Matrix((probe_cell,)), data, plan),
                           RunOptions(results_dir=results_dir, tracking_uri=None, trigger=f"bisect:{commit}",
                                      quiet=True), console)
        outcome = report.answers.get(cell_id)
        if outcome is None:
            result = next(r for r in report.results if r.cell_id == cell_id)
            raise ProbeError(f"commit {commit} could not be measured: {result.reason}")
        return outcome

    def judge_probe(outcome: CellOutcome, reference: CellOutcome) -> tuple[bool, str, float | None]:
        # The good commit's answers are the same cell's, as a history run's: any significant drop counts.
        stage = Stage(alpha=Budget(spec.gate.alpha, 1, early_stop_share=0.0).stage(1))
        verdict = judge(outcome, cells[cell_id].model.floor, spec.gate, stage, history=reference)
        if verdict.status is Status.ERROR:
            raise ProbeError(f"a probe could not be measured: {verdict.reason}")
        return verdict.status is Status.FAIL, verdict.reason, verdict.accuracy

    console.print(f"bisecting {cell_id} over {len(commits)} commits ({good}..{bad})")
    with ray_cluster(loaded, None):
        check_fits(Matrix((cells[cell_id],)))
        result = bisect_commits(commits, run_probe, judge_probe)
    table = Table(title=f"probes of {cell_id}", header_style="bold")
    for column in ("commit", "accuracy", "verdict", "why"):
        table.add_column(column)
    for probe in result.probes:
        table.add_row(probe.commit, "-" if probe.accuracy is None else f"{probe.accuracy:.3f}",
                      "[red]bad[/]" if probe.bad else "[green]good[/]", probe.reason[:120])
    console.print(table)
    return result
