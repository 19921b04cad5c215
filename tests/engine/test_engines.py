"""Engines are one interface (harness.engine.engines): the suite names one, the run is built with it,
and a new engine is one subclass and one registration, whose routes and module the worker uses."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from harness.benchmark.evaluator import EvalSettings
from harness.benchmark.gsm8k.protocol import build_plan
from harness.engine.engines import ENGINES, PORT, PORT_BIND_FAILURE, PYTHON, Engine, SimEngine
from harness.engine.launch import EngineRoutes, LaunchSpec, cell_launch_spec
from harness.errors import ConfigError
from harness.records import CellResult
from harness.run.build import load_matrix
from harness.run.cell import CellJob, run_cell
from tests.helpers import INCIDENT_WORLD, ROOT, machine_s, make_cell

SUITE = f"""
suite: t
engine: {{engine}}
sim_world: {INCIDENT_WORLD}
models:
  - {{{{id: m, path: deepseek-ai/DeepSeek-V2-Lite-Chat, tp: 1, floor: 0.5}}}}
axes:
  attention_backend: [triton]
"""


def write_suite(tmp_path: Path, engine: str, text: str = SUITE) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(text.format(engine=engine))
    return path


def test_an_unknown_engine_is_a_config_error_naming_the_registered_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"engine: unknown engine 'vllm'; available: sglang, sim"):
        load_matrix(write_suite(tmp_path, "vllm"), None)


def test_the_simulator_needs_a_world(tmp_path):
    text = SUITE.replace(f"sim_world: {INCIDENT_WORLD}\n", "")
    with pytest.raises(ConfigError, match="sim_world: required with engine sim"):
        load_matrix(write_suite(tmp_path, "sim", text), None)


def test_the_simulator_refuses_a_model_its_world_does_not_know(tmp_path):
    text = SUITE.replace("deepseek-ai/DeepSeek-V2-Lite-Chat", "org/unknown-model")
    with pytest.raises(ConfigError, match="unknown-model"):
        load_matrix(write_suite(tmp_path, "sim", text), None)


class HealthOnlyEngine(SimEngine):
    """A toy engine: the simulator's program, probed on `/health` and read through the old
    `/get_server_info` route only, as an older server would be."""

    health_route = "/health"
    info_routes = ("/get_server_info",)


def test_a_toy_engine_is_one_class_and_one_registration(tmp_path):
    with ENGINES.registered("toy", HealthOnlyEngine()):
        loaded, matrix = load_matrix(write_suite(tmp_path, "toy"), None)
        spec = cell_launch_spec(loaded, matrix.cells[0], python=sys.executable)
    assert spec.engine == EngineRoutes("toy", "harness.sim", "/health", ("/get_server_info",),
                                       (PORT_BIND_FAILURE,))  # the simulator's crash marker, inherited
    assert spec.env["REGRESS_SIM_WORLD"] == str(INCIDENT_WORLD)  # the simulator's environment, inherited
    argv = spec.argv(30000, 30001)
    assert argv[:3] == [sys.executable, "-m", "harness.sim"] and argv[argv.index("--attention-backend") + 1] == "triton"
    # The spec is data: a worker runs it without the registration (the engine is gone here).
    assert "toy" not in ENGINES
    from harness.benchmark.gsm8k.dataset import load_gsm8k

    plan = build_plan(load_gsm8k(), "clean", 12, 0)
    job = CellJob(spec=LaunchSpec(**{**spec.__dict__, "startup_timeout_s": machine_s(30), "stop_grace_s": 2.0}),
                  settings=EvalSettings(concurrency=4), queued_at=0.0)
    outcome, _ = asyncio.run(run_cell(job, plan, tmp_path / "logs", node="n"))
    assert outcome.error is None, outcome.error
    assert outcome.score is not None and outcome.score.n == 12
    assert outcome.server.resolved["attention_backend"] == "triton"

    # The worker probes the spec's route: a health route the server lacks never becomes ready.
    missing = LaunchSpec(**{**job.spec.__dict__, "engine": EngineRoutes("toy", "harness.sim", "/missing"),
                            "startup_timeout_s": 3.0})
    outcome, _ = asyncio.run(run_cell(CellJob(spec=missing, settings=job.settings, queued_at=0.0), plan,
                                      tmp_path / "logs", node="n"))
    assert outcome.error is not None and outcome.error.kind.value == "not_ready"


def test_a_launch_spec_names_its_engine_module():
    cell = make_cell({"attention_backend": "fa3"})
    assert LaunchSpec(engine=EngineRoutes.of("sglang"), python="py", cell=cell, seed=1,
                      startup_timeout_s=1).argv(1, 2)[:3] == ["py", "-m", "sglang.launch_server"]


def test_a_backend_name_that_cannot_name_a_cell_is_refused():
    """`auto` reads the backends from the build under test; a name with markdown or a path in it
    would reach file names and the PR comment."""
    import sys

    import pytest

    from harness.engine.discover import accepted_attention_backends
    from harness.errors import InfraError

    probe = "import json; print(json.dumps(['triton', '[approve](https://evil.example)']))"
    with pytest.raises(InfraError, match="cannot name a cell"):
        accepted_attention_backends(probe, sys.executable, {})
    assert accepted_attention_backends("print('[\"triton\", \"fa3\"]')", sys.executable, {}) == ("triton", "fa3")


class ToyEngine(Engine):
    """A second engine, not the simulator's: its own program and flag spelling, ready on `/health`,
    no configuration route (its resolved configuration is "not reported"), no teacher forcing."""

    launch_module = "toy_server"
    health_route = "/health"
    info_routes = ()
    flush_route = None
    teacher_forcing = False

    def command(self, cell, seed, platform_flags=()):
        kernel = cell.factors.get("kernel", "plain")  # a custom axis: the engine spells its values itself
        return [PYTHON, str(ROOT / "tests" / "fixtures" / "toy_server.py"), "--weights", cell.model.path,
                "--listen", PORT, "--shards", str(cell.model.tp), "--attn", kernel]


def test_a_second_engine_of_its_own_spelling_runs_a_cell_through_regress_run_into_mlflow(ray_local, tmp_path):
    """What the seam promises: launch.py, server.py and the evaluator speak of no engine by name. The
    toy's cells are judged; what it could not say (its configuration, teacher-forced text) is said
    to be unchecked, never passed."""
    from tests.test_run_end_to_end import children_of, invoke, mlflow_runs, only_run

    suite = tmp_path / "toy.yaml"
    suite.write_text("suite: toy\nengine: toy\nnum_questions: 12\nconcurrency: 4\nstop_grace_s: 2\n"
                     "models: [{id: m, path: some/model, floor: 0.0, startup_timeout_s: 120}]\n"
                     "axes: {kernel: {a: [], b: []}}\n")
    with ENGINES.registered("toy", ToyEngine()):
        result = invoke("run", str(suite), "--results-dir", str(tmp_path / "results"))
    run_dir = only_run(tmp_path / "results")
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    cell = cells["m.kernel-b"]
    assert cell.args[1:] == [str(ROOT / "tests" / "fixtures" / "toy_server.py"), "--weights", "some/model", "--listen",
                             cell.args[5], "--shards", "1", "--attn", "b"]
    assert cell.n == 12 and cell.correct == 0 and cell.status.value != "error"  # answered, graded, judged
    assert "resolved configuration not reported (engine toy has no configuration route): tp_size not checked" \
        in cell.reason and cell.resolved == {}
    assert "divergence vs reference not measured (no question was scored teacher-forced)" in cell.reason
    assert cell.divergence_p is None and cell.self_check_p == {}
    children = children_of(mlflow_runs(tmp_path / "results", "toy"))
    assert sorted(c.data.tags["cell_id"] for c in children) == ["m.kernel-a", "m.kernel-b"]
    assert result.exit_code in (0, 3), result.output
