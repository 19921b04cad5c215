"""A benchmark is one module and one registration (harness.benchmark.registry): this toy one, sums
of two numbers asked through `/v1/completions`, runs through `regress run` on the simulator and is
logged to MLflow like GSM8K. The simulator does not know its answers (it says it cannot work them
out), so every cell scores 0: the point is the path, not the score."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from harness.benchmark.base import Benchmark, Dataset, Grade, Prompt, ProtocolPlan, fingerprinted
from harness.benchmark.registry import BENCHMARKS
from harness.records import CellResult, RunInfo
from tests.helpers import INCIDENT_WORLD
from tests.test_run_end_to_end import children_of, invoke, mlflow_runs, only_run


@dataclass(frozen=True)
class Sums:
    pairs: tuple[tuple[int, int], ...]
    source: str = "toy:sums"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(repr(self.pairs).encode()).hexdigest()


def grade_last_word(output: str, gold: str) -> Grade:
    words = output.strip().rstrip(".").split()
    pred = words[-1] if words else None
    return Grade(pred, pred == gold, pred, pred == gold)


class SumsBenchmark(Benchmark):
    protocols = ("plain",)
    default_protocol = "plain"

    def load(self, path: Path | None) -> Sums:
        return Sums(tuple((a, 2 * a + 1) for a in range(30)))

    def plan(self, data: Dataset, protocol: str, num_questions: int | None, seed: int, max_tokens: int) -> ProtocolPlan:
        assert isinstance(data, Sums)
        pairs = data.pairs[:num_questions]
        prompts = tuple(Prompt(i, str(a + b), f"Question: What is {a} + {b}?\nAnswer:") for i, (a, b) in enumerate(pairs))
        return fingerprinted(ProtocolPlan(protocol, "completions", prompts, ("Question:",), max_tokens, 0.0, (), seed,
                                          data.sha256, "", grader=grade_last_word, benchmark="sums"))


def sums_suite(tmp_path: Path, name: str, axes: str) -> Path:
    """A simulated suite of one model that asks the toy benchmark's 12 questions."""
    suite = tmp_path / "sums.yaml"
    suite.write_text(f"""
suite: {name}
engine: sim
sim_world: {INCIDENT_WORLD}
benchmark: sums
protocol: plain
num_questions: 12
concurrency: 4
stop_grace_s: 2
models:
  - {{id: deepseek, path: deepseek-ai/DeepSeek-V2-Lite-Chat, tp: 1, floor: 0.0, startup_timeout_s: 120}}
axes:
  {axes}
""")
    return suite


def test_a_toy_benchmark_runs_through_regress_run_into_mlflow(ray_local, tmp_path):
    suite = sums_suite(tmp_path, "sums", "attention_backend: [triton, fa3]")
    results = tmp_path / "results"
    with BENCHMARKS.registered("sums", SumsBenchmark()):
        result = invoke("run", str(suite), "--results-dir", str(results))
    run_dir = only_run(results)
    info = RunInfo.model_validate_json((run_dir / "run.json").read_text())
    assert info.benchmark == "sums" and info.protocol == "plain" and info.dataset_sha256 == Sums(
        tuple((a, 2 * a + 1) for a in range(30))).sha256
    cells = [CellResult.model_validate_json(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    assert {c.cell_id for c in cells} == {"deepseek.ab-triton", "deepseek.ab-fa3"}
    for cell in cells:
        assert cell.n == 12 and cell.correct == 0, cell.reason  # answered, graded by the toy grader
        assert cell.invalid_rate == 0.0  # the grader read a last word from every answer
    runs = mlflow_runs(results, "sums")
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.data.params["benchmark"] == "sums" and parent.data.params["protocol"] == "plain"
    children = children_of(runs)
    assert sorted(c.data.tags["cell_id"] for c in children) == ["deepseek.ab-fa3", "deepseek.ab-triton"]
    assert all(c.data.metrics["n"] == 12 for c in children)
    assert result.exit_code in (0, 3), result.output  # nothing regressed; no score can confirm a pass either


def test_a_radix_cell_whose_prompts_share_no_prefix_did_not_test_its_label(ray_local, tmp_path):
    """The toy prompts share no few-shot prefix, so no answer reuses the prefix cache: a radix-on
    cell then tested nothing of its label (`mismatch`, with the counts); a radix-off cell is fine."""
    suite = sums_suite(tmp_path, "sums-radix", "radix_cache: [on, off]")
    results = tmp_path / "results"
    with BENCHMARKS.registered("sums", SumsBenchmark()):
        result = invoke("run", str(suite), "--results-dir", str(results), "--no-tracking")
    run_dir = only_run(results)
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    on = cells["deepseek.rc-on"]
    assert on.status.value == "mismatch"
    assert "radix cache on, but none of 12 answered questions reused a cached prefix" in on.reason
    assert cells["deepseek.rc-off"].status.value != "mismatch", cells["deepseek.rc-off"].reason
    assert result.exit_code == 1


def test_a_toy_benchmark_runs_through_regress_eval_with_its_own_default_protocol_and_dataset_name(tmp_path):
    """`regress eval` builds its questions as `regress run` does (harness.run.build.questions): the
    toy benchmark by name, its default protocol (no --protocol given), and MLflow's dataset input
    named after it."""
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from harness.cli import app
    from tests.run.test_eval_server import running_server

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with running_server(tmp_path) as url, BENCHMARKS.registered("sums", SumsBenchmark()):
        result = CliRunner().invoke(app, ["eval", "--base-url", url, "--benchmark", "sums", "--num-questions", "12",
                                          "--concurrency", "4", "--results-dir", str(tmp_path / "results"),
                                          "--tracking-uri", store, "--name", "toy", "--floor", "0.5"])
    (run_dir,) = (tmp_path / "results").glob("toy-*")
    info = RunInfo.model_validate_json((run_dir / "run.json").read_text())
    assert info.benchmark == "sums" and info.protocol == "plain", result.output
    (cell,) = [CellResult.model_validate_json(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    assert cell.n == 12 and cell.correct == 0 and cell.status.value == "fail"  # the simulator cannot add
    client = MlflowClient(tracking_uri=store)
    (parent,) = [r for r in client.search_runs([client.get_experiment_by_name("toy").experiment_id])
                 if "mlflow.parentRunId" not in r.data.tags]
    assert [entry.dataset.name for entry in parent.inputs.dataset_inputs] == ["sums"]
    unknown = CliRunner().invoke(app, ["eval", "--base-url", "http://127.0.0.1:9", "--benchmark", "sum"])
    assert unknown.exit_code == 2 and "--benchmark: unknown benchmark 'sum'" in unknown.output
