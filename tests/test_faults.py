"""Faults survived: each faulty cell gets the right status and reason, the others are unaffected,
no server process is left behind, and every results file stays valid."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.records import CellResult
from tests.helpers import INCIDENT_WORLD, machine_s

# scenario -> (fault fields, expected status, text expected in the reason)
SCENARIOS = {
    "healthy": ({}, "pass", "accuracy"),
    "startup-exit": ({"startup_exit_code": 3, "startup_message": "torch.OutOfMemoryError: CUDA out of memory"},
                     "error", "exited with code 3 during startup"),
    "never-ready": ({"never_ready": True}, "error", "(startup_timeout_s); it is still running"),
    "crash": ({"crash_after_requests": 10}, "error", "exited with code 139 during evaluation"),
    "server-hang": ({"hang_after_requests": 10}, "error", "server hung"),
    "request-hang": ({"hang_request_rate": 0.1}, "pass", "accuracy"),
    "burst-503": ({"error_rate": 0.4, "error_until_request": 30}, "pass", "accuracy"),
    "burst-429": ({"error_status": 429, "error_rate": 0.4, "error_until_request": 30}, "pass", "accuracy"),
    "keeps-failing": ({"error_rate": 1.0}, "error", "failed in transport"),
    "malformed": ({"malformed_rate": 1.0}, "error", "malformed response"),
    "empty-answers": ({"empty_output_rate": 1.0}, "fail", "below floor"),
    "ignores-sigterm": ({"ignore_sigterm": True}, "pass", "accuracy"),
    "grandchild": ({"spawn_grandchild": True}, "pass", "accuracy"),
}


def processes_mentioning(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_every_fault_gets_its_status_and_nothing_survives(ray_local, tmp_path):
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["faults"] = [{"name": name, "when": {"served_model_name": name}, **fault}
                       for name, (fault, _, _) in SCENARIOS.items() if fault]
    world_path = tmp_path / "fault-world.yaml"
    world_path.write_text(yaml.safe_dump(world))
    suite = {
        "suite": "faults", "engine": "sim", "sim_world": str(world_path), "num_questions": 30,
        "concurrency": 8, "request_timeout_s": machine_s(2), "request_attempts": 3, "stall_timeout_s": machine_s(4),
        "stop_grace_s": 1,
        "gate": {"min_effect": 0.3, "max_infra_failure_rate": 0.1},
        "models": [{"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "floor": 0.5,
                    "startup_timeout_s": machine_s(5), "env": {"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}}],
        "axes": {"scenario": {name: ([] if name == "healthy" else ["--served-model-name", name]) for name in SCENARIOS}},
    }
    suite_path = tmp_path / "faults.yaml"
    suite_path.write_text(yaml.safe_dump(suite))
    result = CliRunner().invoke(app, ["run", str(suite_path), "--results-dir", str(tmp_path / "results"),
                                      "--quiet"], catch_exceptions=False)
    assert result.exit_code == 1  # the empty answers are a regression, not a flake
    run_dir = next((tmp_path / "results").glob("faults-*"))
    cells = {c.cell_id.removeprefix("dsv2.scenario-"): c for c in
             map(CellResult.model_validate_json, (run_dir / "cells.jsonl").read_text().splitlines())}
    assert set(cells) == set(SCENARIOS)
    for name, (_, status, reason) in SCENARIOS.items():
        assert cells[name].status.value == status, (name, cells[name].reason[:500])
        assert reason in cells[name].reason, (name, cells[name].reason[:500])
    assert "CUDA out of memory" in cells["startup-exit"].reason  # the log tail travels with the reason
    assert cells["burst-503"].n == 30 and cells["keeps-failing"].accuracy is None
    assert cells["empty-answers"].invalid_rate == 1.0
    assert processes_mentioning(str(world_path)) == []
    for line in (run_dir / "cells.jsonl").read_text().splitlines():
        json.loads(line)
    assert json.loads((run_dir / "run.json").read_text())["counts"]["error"] == 6


def test_a_full_disk_mid_run_is_exit_3_in_one_line_and_keeps_the_cells_written(ray_local, tmp_path, monkeypatch):
    """The disk fills up after the first cell was written: an infrastructure fault (exit 3, never 1),
    one line, and the first cell still in cells.jsonl for --resume."""
    import errno

    from harness.results.store import ResultsStore

    real_append, calls = ResultsStore.append_cell, []

    def append_then_fill(self, result):
        calls.append(result.cell_id)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path / "cells.jsonl"))
        real_append(self, result)

    monkeypatch.setattr(ResultsStore, "append_cell", append_then_fill)
    result = CliRunner().invoke(app, ["run", "configs/demo.yaml", "--results-dir", str(tmp_path), "--num-questions",
                                      "20", "--select", "model=deepseek-v2-lite,unified_memory=off,radix_cache=on",
                                      "--no-tracking", "--quiet"])
    assert result.exit_code == 3, result.output
    assert "No space left on device" in result.output and "--resume" in result.output
    assert "Traceback" not in result.output
    (cells,) = tmp_path.glob("demo-*/cells.jsonl")
    assert len(cells.read_text().splitlines()) == 1


def test_a_results_folder_that_cannot_be_written_is_exit_2_before_anything_starts(tmp_path):
    import subprocess
    import sys

    (tmp_path / "a-file").write_text("")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "configs/demo.yaml", "--results-dir",
                           str(tmp_path / "a-file" / "results")], capture_output=True, text=True,
                          timeout=machine_s(120), env={**os.environ, "RAY_TMPDIR": str(tmp_path / "ray")})
    assert done.returncode == 2 and "--results-dir" in done.stderr and "cannot be written" in done.stderr
    assert not (tmp_path / "ray").exists()  # Ray never started
