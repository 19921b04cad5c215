"""`regress run` end to end: Ray, servers (simulated, and sglang through a fake package), gate, sinks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from harness.cli import app
from harness.records import CellResult, RunInfo
from harness.results.store import ResultsStore
from tests.helpers import INCIDENT_WORLD, ROOT, machine_s

CONTRACT_FIELDS = {"cell_id", "model", "factors", "args", "resolved", "status", "reason", "accuracy", "n", "correct",
                   "ci_low", "ci_high", "invalid_rate", "truncated_rate", "reference_cell", "agreement", "mcnemar_p",
                   "threshold", "timings", "throughput", "mlflow_run_id", "log_path"}
INCIDENT_CELLS = {f"{model}.ab-{backend}.um-on.rc-on" for model in ("kimi-linear",)
                  for backend in ("fa3", "flashinfer", "flashmla")}
FAKE_SGLANG = ROOT / "tests" / "fixtures" / "fake_sglang"


def only_run(results_dir: Path) -> Path:
    runs = [p for p in results_dir.iterdir() if (p / "run.json").exists()]
    assert len(runs) == 1
    return runs[0]


def mlflow_runs(results_dir: Path, suite: str) -> list:
    """Every run of the suite's experiment in the run's default store (read without touching globals)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(suite)
    assert experiment is not None, f"no MLflow experiment {suite} in {results_dir}"
    return client.search_runs([experiment.experiment_id], max_results=1000)


def children_of(runs: list) -> list:
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result


def run_simulated(tmp_path: Path, name: str, axes: dict, world: Path = INCIDENT_WORLD, **suite: object):
    """`regress run` of a one-model simulated suite (DeepSeek-V2-Lite, floor 0.5) with `axes`, into
    tmp_path/results without MLflow: (the result, the run's folder, its cells by id, the latest line each)."""
    import yaml

    spec = {"suite": name, "engine": "sim", "sim_world": str(world), "num_questions": 40, "concurrency": 16,
            "stop_grace_s": 1, **suite,
            "models": [{"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "floor": 0.5}], "axes": axes}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = invoke("run", str(tmp_path / f"{name}.yaml"), "--results-dir", str(tmp_path / "results"), "--no-tracking",
                    "--quiet")
    run_dir = only_run(tmp_path / "results")
    cells = {c.cell_id: c for c in (CellResult.model_validate_json(line)
                                    for line in (run_dir / "cells.jsonl").read_text().splitlines())}
    return result, run_dir, cells


def test_small_simulated_run_in_process(ray_local, tmp_path):
    result = invoke("run", "configs/demo.yaml", "--results-dir", str(tmp_path), "--num-questions", "40",
                    "--select", "model=kimi-linear,unified_memory=on,radix_cache=on,attention_backend=fa3|triton",
                    "--tag", "pr=1234")
    assert result.exit_code == 1, result.output
    run_dir = only_run(tmp_path)
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    assert set(cells) == {"kimi-linear.ab-fa3.um-on.rc-on", "kimi-linear.ab-triton.um-on.rc-on",
                          "kimi-linear.ab-triton.um-off.rc-on"}
    assert cells["kimi-linear.ab-fa3.um-on.rc-on"].status.value == "fail"
    # Healthy, but 40 questions cannot bound its drop under min_effect (3 points): never a pass.
    healthy = cells["kimi-linear.ab-triton.um-on.rc-on"]
    assert healthy.status.value == "inconclusive" and "the bound is not under min_effect 3 pts" in healthy.reason
    assert cells["kimi-linear.ab-fa3.um-on.rc-on"].n == 20 and cells["kimi-linear.ab-fa3.um-on.rc-on"].stopped_early
    assert cells["kimi-linear.ab-triton.um-on.rc-on"].n == 40
    assert "failures share" in result.output and str(run_dir) in result.output
    runs = mlflow_runs(tmp_path, "demo")
    assert len(runs) == 4 and len(children_of(runs)) == 3
    # What people see in MLflow's UI: a parent that completed (its verdict is a tag, not FAILED), the
    # sglang version, the PR, GSM8K as the dataset input, and each cell as long as it held its GPUs.
    (parent,) = [r for r in runs if r not in children_of(runs)]
    assert parent.info.status == "FINISHED" and parent.data.tags["verdict"] == "regressions"
    assert parent.data.tags["sglang_version"] == "0.5.6-sim" and parent.data.tags["pr"] == "1234"
    assert [d.dataset.name for d in parent.inputs.dataset_inputs] == ["gsm8k"]
    for child in children_of(runs):
        cell = cells[child.data.tags["cell_id"]]
        assert child.info.status == "FINISHED"
        assert abs(child.info.start_time / 1000 - cell.timings.started_at) < 1
        assert abs(child.info.end_time / 1000 - cell.timings.ended_at) < 1
    assert json.loads((run_dir / "run.json").read_text())["tags"] == {"pr": "1234"}
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_experiment_by_name("demo")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens the runs table
    assert "lowest accuracy first" in result.output and "viewStateShareKey=regress-cells" in result.output
    view = json.loads(experiment.tags["mlflow.sharedViewState.regress-cells"])  # what that link opens
    assert view["orderByKey"] == "metrics.`accuracy`" and view["orderByAsc"] is True
    assert {"metrics.`accuracy`", "params.`attention_backend`", "tags.`status`"} <= set(view["selectedColumns"])


def test_sglang_engine_through_a_fake_sglang_package(ray_local, tmp_path):
    """The real sglang path: exact argv, inherited env plus the model's, GPUs from Ray; a mismatch
    the plan-time check predicts is decided without starting a server."""
    record_dir = tmp_path / "record"
    record_dir.mkdir()
    env = {"PYTHONPATH": f"{FAKE_SGLANG}:{ROOT}", "REGRESS_SIM_WORLD": str(INCIDENT_WORLD),
           "FAKE_SGLANG_RECORD_DIR": str(record_dir), "FAKE_MARKER": "from-model-env"}
    suite = tmp_path / "sglang.yaml"
    suite.write_text(f"""
suite: fake-sglang
engine: sglang
seed: 7
num_questions: 30
stop_grace_s: 2
gate: {{tolerance: 0.2, min_effect: 0.5}}  # what 30 questions can bound
models:
  - id: kimi-linear
    path: moonshotai/Kimi-Linear-48B-A3B-Instruct
    tp: 2
    floor: 0.8
    trust_remote_code: true
    env: {json.dumps(env)}
  - id: deepseek
    path: deepseek-ai/DeepSeek-V2-Lite-Chat
    tp: 2
    floor: 0.5
    env: {json.dumps(env)}
axes:
  attention_backend: [triton, default]
  radix_cache: [on]
""")
    result = invoke("run", str(suite), "--results-dir", str(tmp_path / "results"), "--no-tracking")
    run_dir = only_run(tmp_path / "results")
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    # Without --mamba-radix-cache-strategy extra_buffer this model quietly runs without the radix cache:
    # sglang's own resolution says so at plan time, and no server is started for it.
    for cell_id in ("kimi-linear.ab-triton.rc-on", "kimi-linear.ab-default.rc-on"):
        cell = cells[cell_id]
        assert cell.status.value == "mismatch", cell.reason
        assert "disable_radix_cache: requested False, sglang resolves it to True (plan-time check; no server was " \
               "started)" in cell.reason
        assert cell.timings.startup_s == 0 and cell.node is None
    assert cells["kimi-linear.ab-default.rc-on"].predicted["attention_backend"] == "fa3"  # what `default` resolves to
    assert {c.status.value for c in cells.values() if c.model == "deepseek"} == {"pass"}
    assert result.exit_code == 1
    recorded = [json.loads(p.read_text()) for p in record_dir.glob("*.json")]
    assert len(recorded) == 2  # the two DeepSeek cells; neither Kimi-Linear cell was launched
    for entry in recorded:
        cell = next(c for c in cells.values() if c.args[3:] == entry["argv"])
        assert entry["python"] == sys.executable and cell.args[:3] == [sys.executable, "-m", "sglang.launch_server"]
        assert entry["argv"][entry["argv"].index("--random-seed") + 1] == "7"
        assert entry["env"]["FAKE_MARKER"] == "from-model-env"
        assert entry["env"]["CUDA_VISIBLE_DEVICES"] == cell.cuda_visible_devices
        assert len(entry["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 2  # tp 2: two GPUs from Ray
        assert entry["pgid"] == entry["pid"]  # own process group, same session as the Ray worker


def test_a_suite_with_a_typo_exits_2_and_launches_nothing(tmp_path):
    suite = tmp_path / "typo.yaml"
    suite.write_text((ROOT / "configs" / "demo.yaml").read_text().replace("num_questions:", "num_question:"))
    result = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--results-dir",
                             str(tmp_path / "r")], capture_output=True, text=True, timeout=machine_s(120), cwd=ROOT)
    assert result.returncode == 2
    assert "num_question" in result.stderr and "did you mean 'num_questions'" in result.stderr
    assert not (tmp_path / "r").exists() and "Ray" not in result.stderr


def test_auto_expands_to_the_backends_the_installed_sglang_accepts(ray_local, tmp_path):
    """`auto` reads `--attention-backend`'s choices from (fake) sglang on a worker: a build that
    knows only three backends gets exactly three cells per model, minus exclusions."""
    import yaml

    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["attention_backends"] = ["triton", "fa3", "brand_new_backend"]
    world["models"]["example/dense"] = {"accuracy": 0.9}
    world_path = tmp_path / "world.yaml"
    world_path.write_text(yaml.safe_dump(world))
    env = {"PYTHONPATH": f"{FAKE_SGLANG}:{ROOT}", "REGRESS_SIM_WORLD": str(world_path)}
    suite = tmp_path / "auto.yaml"
    suite.write_text(yaml.safe_dump({
        "suite": "auto", "engine": "sglang", "num_questions": 10, "stop_grace_s": 2,
        "gate": {"tolerance": 0.2, "min_effect": 0.5},  # what 10 questions can bound
        "models": [{"id": "dense", "path": "example/dense", "floor": 0.5, "env": env}],
        "axes": {"attention_backend": ["triton", "auto"]},
        "exclude": [{"attention_backend": "fa3", "reason": "known broken on this GPU"}]}))
    result = invoke("run", str(suite), "--results-dir", str(tmp_path / "results"), "--no-tracking", "--quiet")
    run_dir = only_run(tmp_path / "results")
    cells = {c.cell_id: c.status.value for c in map(CellResult.model_validate_json,
                                                     (run_dir / "cells.jsonl").read_text().splitlines())}
    assert cells == {"dense.ab-triton": "pass", "dense.ab-brand_new_backend": "pass", "dense.ab-fa3": "skipped"}
    assert result.exit_code == 0


def test_fail_fast_stops_at_the_first_regression(ray_local, tmp_path):
    result = invoke("run", "configs/demo.yaml", "--results-dir", str(tmp_path), "--num-questions", "40",
                    "--no-tracking", "--quiet", "--fail-fast")
    assert result.exit_code == 1
    lines = (only_run(tmp_path) / "cells.jsonl").read_text().splitlines()
    statuses = [CellResult.model_validate_json(line).status.value for line in lines]
    assert "fail" in statuses and len(lines) < 32


def test_order_puts_recent_failures_first_and_each_reference_ahead_of_its_cells(tmp_path):
    from harness.records import Status, Timings
    from harness.results.archive import FolderArchive
    from harness.run.history import History
    from harness.run.pipeline import failed_first
    from harness.run.scheduling.durations import Durations
    from harness.run.scheduling.placement import priority_order
    from harness.suite.config import load_suite
    from harness.suite.matrix import expand

    loaded = load_suite(ROOT / "configs" / "demo.yaml")
    matrix = expand(loaded.suite)
    cells = list(matrix.cells)
    failed, slow = "kimi-linear.ab-fa3.um-on.rc-on", "kimi-linear.ab-fa3.um-off.rc-off"
    store = ResultsStore(tmp_path, "demo-20261101-000000-aaaa")
    store.write_run(RunInfo(run_id=store.run_id, suite="demo", config_path="x", config_sha256="0", engine="sim",
                            harness_version="t", protocol="clean", protocol_fingerprint="fp",
                            started_at="2026-11-01T00:00:00+00:00"))
    for cell_id, status, seconds in ((failed, Status.FAIL, 5), (slow, Status.PASS, 500)):
        store.append_cell(CellResult(cell_id=cell_id, model="kimi-linear", factors={}, args=[], resolved={},
                                     status=status, reason="", timings=Timings(total_s=seconds)))
    history = History.of(FolderArchive(tmp_path), "demo", "fp", "this-run")
    durations = Durations(history.latest())
    kimi, deepseek = "kimi-linear.ab-triton.um-off.rc-on", "deepseek-v2-lite.ab-triton.um-off.rc-on"
    order = [c.cell_id for c in priority_order(cells, durations, failed_first(cells, history, True))]
    assert order[:3] == [kimi, failed, slow]  # the failure with its reference, then the widest, longest
    for cell in matrix.cells:  # every reference ahead of the cells compared with it
        assert cell.reference_cell is None or order.index(cell.reference_cell) < order.index(cell.cell_id)
    assert order.index(deepseek) == min(i for i, cell_id in enumerate(order) if cell_id.startswith("deepseek"))
    # A nightly may let packing alone decide: the cell that failed (5 s last time) is no longer early.
    order = [c.cell_id for c in priority_order(cells, durations, failed_first(cells, history, False))]
    assert order[:2] == [kimi, slow] and order.index(failed) > 2


def test_undecided_cells_are_extended_with_unasked_test_then_train_questions_and_decided(ray_local, tmp_path):
    """A 4-point drop is not significant on 200 questions; extended to 1,500 it is (stage 2)."""
    import yaml

    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["bugs"] = [{"name": "small", "when": {"attention_backend": "fa3"}, "corrupt_probability": [0.045, 0.045],
                      "style": "wrong"}]
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    suite = {"suite": "extend", "engine": "sim", "sim_world": str(tmp_path / "world.yaml"), "num_questions": 200,
             "concurrency": 64, "stop_grace_s": 1, "gate": {"extend_to": 1500},
             "models": [{"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "floor": 0.5}],
             "axes": {"attention_backend": ["triton", "fa3"]}}
    (tmp_path / "extend.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    result = invoke("run", str(tmp_path / "extend.yaml"), "--results-dir", str(tmp_path / "results"), "--no-tracking",
                    "--quiet")
    run_dir = only_run(tmp_path / "results")
    lines = [CellResult.model_validate_json(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    first = {c.cell_id: c for c in lines[:2]}
    final = {c.cell_id: c for c in lines}
    assert first["dsv2.ab-fa3"].status.value == "inconclusive" and first["dsv2.ab-fa3"].n == 200
    assert final["dsv2.ab-fa3"].status.value == "fail" and final["dsv2.ab-fa3"].n == 1500
    assert "extended to 1500 questions" in final["dsv2.ab-fa3"].reason
    assert result.exit_code == 1
    indices = [json.loads(q)["index"] for q in (run_dir / "questions" / "dsv2.ab-fa3.jsonl").read_text().splitlines()]
    test = [i for i in indices if i < 100_000]
    extra = [i - 100_000 for i in indices if i >= 100_000]  # train questions, recorded with an offset
    # The extension asks the test questions the plan did not, then train questions: 1,319 + 181.
    assert len(indices) == 1500 and len(set(test)) == 1319 and len(set(extra)) == len(extra) == 181
    assert final["dsv2.ab-fa3"].floor_n == 1319
    # The self-checks are made at stage 1 (20 of 200 questions); the extended line keeps their figures.
    assert first["dsv2.ab-fa3"].self_check_p and final["dsv2.ab-fa3"].stage == 2
    assert final["dsv2.ab-fa3"].self_check_p == first["dsv2.ab-fa3"].self_check_p
    assert final["dsv2.ab-fa3"].self_check_high == first["dsv2.ab-fa3"].self_check_high


def test_a_cell_no_node_can_hold_waits_then_says_why_and_the_rest_run(ray_local, tmp_path, monkeypatch):
    """Nodes that left (or never joined): the cell is `error` after cluster.wait_for_nodes_s."""
    monkeypatch.setattr("harness.run.ray.cluster.check_fits", lambda matrix, resource="GPU": None)  # as if a node left later
    suite = tmp_path / "wide.yaml"
    suite.write_text(f"""
suite: wide
engine: sim
sim_world: {INCIDENT_WORLD}
num_questions: 20
stop_grace_s: 1
cluster: {{wait_for_nodes_s: 1}}
models:
  - {{id: small, path: deepseek-ai/DeepSeek-V2-Lite-Chat, tp: 2, floor: 0.5}}
  - {{id: huge, path: moonshotai/Kimi-Linear-48B-A3B-Instruct, tp: 16, floor: 0.5}}
axes: {{attention_backend: [triton]}}
""")
    result = invoke("run", str(suite), "--results-dir", str(tmp_path / "results"), "--no-tracking", "--quiet")
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json,
                                       (only_run(tmp_path / "results") / "cells.jsonl").read_text().splitlines())}
    assert cells["small.ab-triton"].status.value == "pass"
    assert cells["huge.ab-triton"].status.value == "error"
    assert "no node of the cluster could hold it (16 GPU(s))" in cells["huge.ab-triton"].reason
    assert result.exit_code == 3


def test_the_server_runs_under_the_workers_interpreter_with_the_workers_sglang(ray_local, tmp_path):
    """A PR build: Ray gives the workers another environment (its own interpreter, and an sglang the
    driver cannot import). The server must start with the worker's interpreter and that sglang."""
    import importlib.util

    assert importlib.util.find_spec("sglang") is None  # the driver has no sglang
    venv = Path(sys.prefix)
    worker_env = tmp_path / "pr-build"  # another environment: its own interpreter path, the same packages
    (worker_env / "bin").mkdir(parents=True)
    (worker_env / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    (worker_env / "lib").symlink_to(venv / "lib")
    (worker_env / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    record_dir = tmp_path / "record"
    record_dir.mkdir()
    runtime_env = {"py_executable": str(worker_env / "bin" / "python"),
                   "env_vars": {"PYTHONPATH": f"{FAKE_SGLANG}:{ROOT}", "FAKE_SGLANG_RECORD_DIR": str(record_dir),
                                "REGRESS_SIM_WORLD": str(INCIDENT_WORLD)}}
    suite = tmp_path / "pr.yaml"
    suite.write_text(f"""
suite: pr-build
engine: sglang
num_questions: 20
stop_grace_s: 2
cluster: {{runtime_env: {json.dumps(runtime_env)}}}
models: [{{id: dsv2, path: deepseek-ai/DeepSeek-V2-Lite-Chat, floor: 0.5}}]
axes: {{attention_backend: [triton]}}
""")
    result = invoke("run", str(suite), "--results-dir", str(tmp_path / "results"), "--no-tracking")
    (cell,) = map(CellResult.model_validate_json, (only_run(tmp_path / "results") / "cells.jsonl").read_text().splitlines())
    assert cell.status.value == "pass", cell.reason
    assert cell.args[0] == str(worker_env / "bin" / "python") and result.exit_code == 0
    (launch,) = [json.loads(p.read_text()) for p in record_dir.glob("*.json")]
    assert launch["python"] == str(worker_env / "bin" / "python")


def test_a_cell_the_installed_sglang_refuses_is_skipped_with_its_message_before_any_gpu(ray_local, tmp_path):
    """The plan-time check runs each cell's argv through the workers' sglang (here a stand-in with one
    of sglang 0.5.23's real refusals): the refused cell never launches, and says why."""
    record_dir = tmp_path / "record"
    record_dir.mkdir()
    env = {"PYTHONPATH": f"{FAKE_SGLANG}:{ROOT}", "REGRESS_SIM_WORLD": str(INCIDENT_WORLD),
           "FAKE_SGLANG_RECORD_DIR": str(record_dir)}
    suite = tmp_path / "tbo.yaml"
    suite.write_text(f"""
suite: tbo
engine: sglang
num_questions: 20
stop_grace_s: 2
models:
  - {{id: dsv2, path: deepseek-ai/DeepSeek-V2-Lite-Chat, floor: 0.5, env: {json.dumps(env)}}}
axes:
  attention_backend: [triton]
  overlap: {{none: [], tbo: [--enable-two-batch-overlap]}}
""")
    result = invoke("run", str(suite), "--results-dir", str(tmp_path / "results"), "--no-tracking")
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json,
                                       (only_run(tmp_path / "results") / "cells.jsonl").read_text().splitlines())}
    refused = cells["dsv2.ab-triton.overlap-tbo"]
    assert refused.status.value == "skipped" and result.exit_code == 0, result.output
    assert refused.reason.startswith("sglang refuses it: ValueError: When enabling two batch overlap")
    launches = [json.loads(p.read_text())["argv"] for p in record_dir.glob("*.json")]
    assert launches and not any("--enable-two-batch-overlap" in argv for argv in launches)
    # The accepted cell ran, and the check's prediction was recorded beside what the server resolved.
    ran = cells["dsv2.ab-triton.overlap-none"]
    assert ran.status.value == "pass" and ran.predicted["attention_backend"] == "triton"
    assert ran.predicted["disable_radix_cache"] == ran.resolved["disable_radix_cache"]


def test_an_older_sglang_that_does_not_report_a_flag_it_lacks_gives_no_false_mismatch(ray_local, tmp_path):
    """A stand-in sglang built before --enable-unified-memory reports no such key: a cell that did not
    pass the flag is judged, not `mismatch` (a false regression that would also break bisect)."""
    import yaml

    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["unreported_fields"] = ["enable_unified_memory"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(world))
    env = {"PYTHONPATH": f"{FAKE_SGLANG}:{ROOT}", "REGRESS_SIM_WORLD": str(tmp_path / "old.yaml")}
    suite = tmp_path / "old-build.yaml"
    suite.write_text(f"""
suite: old-build
engine: sglang
num_questions: 20
stop_grace_s: 2
models:
  - {{id: dsv2, path: deepseek-ai/DeepSeek-V2-Lite-Chat, floor: 0.5, env: {json.dumps(env)}}}
axes: {{attention_backend: [triton], unified_memory: [off, on]}}
""")
    invoke("run", str(suite), "--results-dir", str(tmp_path / "results"), "--no-tracking")
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json,
                                       (only_run(tmp_path / "results") / "cells.jsonl").read_text().splitlines())}
    assert cells["dsv2.ab-triton.um-off"].status.value == "pass", cells["dsv2.ab-triton.um-off"].reason
    assert "enable_unified_memory" not in cells["dsv2.ab-triton.um-off"].resolved
    on = cells["dsv2.ab-triton.um-on"]  # the flag was passed: the server must say it honoured it
    assert on.status.value == "mismatch" and "enable_unified_memory: requested True, not reported" in on.reason


def test_a_cell_that_starts_after_its_reference_stops_early_on_divergence(ray_local, tmp_path):
    """A bug that changes no final answer (the incident's, style `unchanged`): accuracy cannot stop
    the cell, but its slot holds the judged reference's teacher records and the divergence looks
    stop it at the first look. One cell at a time (tp 8 on the test cluster's 8 GPUs), its reference first."""
    world = tmp_path / "quiet.yaml"
    world.write_text((ROOT / "configs" / "sim" / "incident.yaml").read_text().replace("style: mixed", "style: unchanged"))
    suite = tmp_path / "quiet-suite.yaml"
    suite.write_text(f"""
suite: quiet
engine: sim
sim_world: {world}
num_questions: 200
concurrency: 8
gate: {{extend_to: null}}
models:
  - {{id: kimi-linear, path: moonshotai/Kimi-Linear-48B-A3B-Instruct, tp: 8, floor: 0.85,
     extra_args: [--mamba-radix-cache-strategy, extra_buffer], startup_timeout_s: 60}}
axes: {{attention_backend: [triton, fa3], unified_memory: [off, on], radix_cache: [on]}}
exclude: [{{attention_backend: fa3, unified_memory: off}}, {{attention_backend: triton, unified_memory: on}}]
baseline: {{attention_backend: triton, unified_memory: off, radix_cache: on}}
""")
    result = invoke("run", str(suite), "--results-dir", str(tmp_path / "results"), "--no-tracking")
    run_dir = only_run(tmp_path / "results")
    cells = {c.cell_id: c for c in map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    broken = cells["kimi-linear.ab-fa3.um-on.rc-on"]
    assert broken.status.value == "fail" and broken.stopped_early, broken.reason
    assert "stopped early after the first 20 comparable questions of the seeded order: divergence" in broken.reason
    assert broken.n < 200 and broken.accuracy > 0.8  # its answers were as good as ever
    assert cells["kimi-linear.ab-triton.um-off.rc-on"].status.value == "pass"
    assert result.exit_code == 1, result.output


def test_references_are_launched_a_second_time_and_measure_launch_spread_through_regress_run(ray_local, tmp_path):
    """gate.measure_launch_spread: after the first pass each reference runs on a server of its own
    again; its answers carry their launch, the cell line says 2 launches and holds the run's
    launch-spread sample, and early stop does not look at the second launch."""
    result, run_dir, final = run_simulated(tmp_path, "twice", {"attention_backend": ["triton", "fa3"]},
                                           gate={"max_launches": 2, "measure_launch_spread": True})
    reference = final["dsv2.ab-triton"]
    assert reference.launches == 2 and reference.stage == 2 and "launched 2 times" in reference.reason
    assert reference.launch_sample is not None and reference.launch_sample.df == 1 and reference.launch_sample.n == 40
    launches = [json.loads(q)["launch"] for q in (run_dir / "questions" / "dsv2.ab-triton.jsonl").read_text().splitlines()]
    assert sorted(set(launches)) == [0, 1] and launches.count(1) == 40
    # 40 questions cannot bound a drop under 3 points: the cell was undecided and launched again
    # too, but a relaunch made because a cell looked undecided is no launch-spread sample.
    cell = final["dsv2.ab-fa3"]
    assert cell.launches == 2 and cell.launch_sample is None and cell.status.value == "inconclusive"
    assert cell.decide and result.exit_code == 3, result.output
