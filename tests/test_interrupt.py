"""Interrupting a run keeps what finished, stops every server, and `--resume` runs only the rest.
Tracking that is unreachable never costs results. Secrets given by environment never leak."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.run.ray.slot_actor import log_folder_pid, orphaned_log_folders
from tests.helpers import INCIDENT_WORLD, ROOT, machine_s
from tests.test_faults import processes_mentioning

REGRESS = str(Path(sys.executable).parent / "regress")


def slow_suite(tmp_path: Path, gpus: int = 2) -> tuple[Path, Path]:
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["latency"] = {"slots": 4, "base_s": 0.05, "startup_s": 0.2}
    world_path = tmp_path / "slow-world.yaml"
    world_path.write_text(yaml.safe_dump(world))
    suite = {"suite": "slow", "engine": "sim", "sim_world": str(world_path), "num_questions": 40, "concurrency": 4,
             "stop_grace_s": 1, "cluster": {"gpus": gpus},
             "models": [{"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "floor": 0.5}],
             "axes": {"attention_backend": ["triton", "fa3", "flashinfer", "flashmla"], "radix_cache": ["off", "on"]},
             "gate": {"min_effect": 0.3}}
    suite_path = tmp_path / "slow.yaml"
    suite_path.write_text(yaml.safe_dump(suite))
    return suite_path, world_path


def wait_for_lines(results: Path, at_least: int) -> Path:
    """The run's cells.jsonl once it holds `at_least` cells."""
    deadline = time.monotonic() + machine_s(120)
    while time.monotonic() < deadline:
        found = list(results.glob("slow-*/cells.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= at_least:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} cells finished in time")


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def interrupt(command: list[str], results: Path, at_least: int, stop_signal: signal.Signals,
              world_path: Path) -> tuple[Path, list[str], set[int]]:
    """Start `command`, send `stop_signal` once `at_least` cells are written: the lines kept, and the
    slots that were serving a cell of this test's world then (the parents of its simulated servers;
    the stop kills them mid-cell). Other tests may kill slots of their own meanwhile (pytest-xdist)."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cells_file = wait_for_lines(results, at_least)
    serving = {parent_of(pid) for pid in processes_mentioning(str(world_path))} - {None}
    process.send_signal(stop_signal)
    _, stderr = process.communicate(timeout=machine_s(60))
    assert process.returncode == 130, stderr[-3000:]
    run_info = json.loads((cells_file.parent / "run.json").read_text())
    assert run_info["interrupted"] is True
    return cells_file, cells_file.read_text().splitlines(), serving


@pytest.mark.slow
def test_ctrl_c_then_sigterm_keep_finished_cells_and_each_resume_runs_only_the_rest(tmp_path):
    """Ctrl-C stops the run; its resume is stopped by SIGTERM (a CI job cancelled); the second resume
    completes it: every finished cell kept once, in order, no server left behind either time."""
    suite_path, world_path = slow_suite(tmp_path)
    results = tmp_path / "results"
    run = [REGRESS, "run", str(suite_path), "--results-dir", str(results), "--quiet"]
    cells_file, finished, killed = interrupt(run, results, 2, signal.SIGINT, world_path)
    assert 2 <= len(finished) < 8
    time.sleep(1)
    assert processes_mentioning(str(world_path)) == []
    run_id = json.loads((cells_file.parent / "run.json").read_text())["run_id"]
    _, kept, killed_again = interrupt([*run, "--resume", run_id], results, len(finished) + 1, signal.SIGTERM,
                                      world_path)
    assert kept[:len(finished)] == finished and len(finished) < len(kept) < 8
    time.sleep(1)
    assert processes_mentioning(str(world_path)) == []
    resumed = subprocess.run([*run, "--resume", run_id], cwd=ROOT, capture_output=True, text=True,
                             timeout=machine_s(300))
    lines = cells_file.read_text().splitlines()
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert lines[:len(kept)] == kept and len(lines) == 8
    assert len({json.loads(line)["cell_id"] for line in lines}) == 8
    assert json.loads((cells_file.parent / "run.json").read_text())["interrupted"] is False
    # The cells killed by the two stops left their log folders; the cells run since removed them.
    killed |= killed_again
    assert killed
    assert [f for f in orphaned_log_folders(Path(tempfile.gettempdir())) if log_folder_pid(f) in killed] == []


def test_unreachable_tracking_server_costs_no_results(ray_local, tmp_path):
    suite_path, _ = slow_suite(tmp_path)
    result = CliRunner().invoke(app, ["run", str(suite_path), "--results-dir", str(tmp_path / "results"),
                                      "--tracking-uri", "http://127.0.0.1:9", "--num-questions", "10",
                                      "--select", "attention_backend=triton"], catch_exceptions=False)
    run_dir = next((tmp_path / "results").glob("slow-*"))
    assert len((run_dir / "cells.jsonl").read_text().splitlines()) == 2
    run_info = json.loads((run_dir / "run.json").read_text())
    assert run_info["tracking_error"] and "MLflow" in run_info["tracking_error"] + result.output
    # Refused at once (nothing listens on port 9), not after MLflow's retries and their backoff.
    assert "nothing listens at 127.0.0.1:9 (connection refused)" in run_info["tracking_error"]
    assert result.exit_code == 0


def test_secrets_from_the_environment_never_reach_outputs(ray_local, tmp_path, monkeypatch):
    secret = "hf_SECRET_do_not_leak_4242"
    suite_path, _ = slow_suite(tmp_path)
    suite = yaml.safe_load(suite_path.read_text())
    suite["models"][0]["env"] = {"HF_TOKEN": secret}
    suite["cluster"]["runtime_env"] = {"env_vars": {"MLFLOW_TRACKING_TOKEN": secret}}
    suite_path.write_text(yaml.safe_dump(suite))
    monkeypatch.setenv("HF_TOKEN", secret)
    result = CliRunner().invoke(app, ["run", str(suite_path), "--results-dir", str(tmp_path / "results"),
                                      "--num-questions", "10", "--select", "attention_backend=triton"],
                                catch_exceptions=False)
    assert result.exit_code == 0 and secret not in result.output
    # The suite file itself holds it; everything the run wrote must not.
    for path in (tmp_path / "results").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
