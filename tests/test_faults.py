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


def _disk_fills_after(count: int, monkeypatch, frees_after: int | None = None) -> list[str]:
    """ResultsStore writes into a run folder under `results` fail with ENOSPC after `count` cells were
    appended (until `frees_after` further attempts, if given); the rescue folder's writes succeed."""
    import errno

    from harness.results.store import ResultsStore

    real_append, attempts = ResultsStore.append_cell, []

    def append_on_a_filling_disk(self, result):
        if self.root.name == "results":
            attempts.append(result.cell_id)
            full = len(attempts) > count and (frees_after is None or len(attempts) <= count + frees_after)
            if full:
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path / "cells.jsonl"))
        real_append(self, result)

    monkeypatch.setattr(ResultsStore, "append_cell", append_on_a_filling_disk)
    return attempts


def _small_run(tmp_path: Path) -> list[str]:
    """4 healthy DeepSeek cells of 20 questions, under a gate 20 questions can meet (they pass)."""
    from tests.helpers import ROOT, few_questions_suite

    suite = few_questions_suite(yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text()))
    suite["sim_world"] = str(ROOT / suite["sim_world"])
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    return ["run", str(tmp_path / "suite.yaml"), "--num-questions", "20", "--no-tracking", "--quiet",
            "--select", "model=deepseek-v2-lite,unified_memory=off,radix_cache=on"]


def test_a_full_disk_mid_run_keeps_every_answer_says_where_and_exits_3(ray_local, tmp_path, monkeypatch):
    """The disk fills up after the first cell was written: the run goes on, the cells the disk refused
    are kept and written to the rescue folder at the close, run.json there says so, and the run ends
    with exit 3 (never 1) and one line that names both folders."""
    monkeypatch.setenv("REGRESS_RESCUE_DIR", str(tmp_path / "rescue"))
    _disk_fills_after(1, monkeypatch)
    result = CliRunner().invoke(app, [*_small_run(tmp_path), "--results-dir", str(tmp_path / "results")])
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    lines = [text for text in result.output.strip().splitlines() if "Token authentication" not in text]  # Ray's
    assert len(lines) == 1, result.output
    (line,) = lines
    assert "No space left on device" in line and str(tmp_path / "rescue") in line and "--resume" in line
    (cells,) = (tmp_path / "results").glob("*/cells.jsonl")
    written = [CellResult.model_validate_json(text) for text in cells.read_text().splitlines()]
    (rescue,) = (tmp_path / "rescue").glob("*")
    rescued = [CellResult.model_validate_json(text) for text in (rescue / "cells.jsonl").read_text().splitlines()]
    assert len(written) == 1 and len(rescued) == 3  # 4 backends: one before the disk filled, 3 after
    assert len({r.cell_id for r in written + rescued}) == 4  # each cell once, in one folder or the other
    for cell in rescued:
        assert (rescue / "questions" / f"{cell.cell_id}.jsonl").read_text().count("\n") == 20
    info = json.loads((rescue / "run.json").read_text())
    assert "No space left on device" in info["results_error"] and info["counts"] == {"pass": 4}


def test_a_disk_that_fills_and_frees_again_loses_nothing_and_keeps_the_verdict(ray_local, tmp_path, monkeypatch):
    """Space comes back before the close: every kept cell is written where it belongs, in order."""
    monkeypatch.setenv("REGRESS_RESCUE_DIR", str(tmp_path / "rescue"))
    attempts = _disk_fills_after(1, monkeypatch, frees_after=1)
    result = CliRunner().invoke(app, [*_small_run(tmp_path), "--results-dir", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    assert len(attempts) == 5  # 4 cells, one of them tried twice
    (cells,) = (tmp_path / "results").glob("*/cells.jsonl")
    assert len(cells.read_text().splitlines()) == 4 and not (tmp_path / "rescue").exists()
    assert json.loads((cells.parent / "run.json").read_text())["results_error"] is None


def test_a_results_folder_that_cannot_be_written_is_exit_2_before_anything_starts(tmp_path):
    import subprocess
    import sys

    (tmp_path / "a-file").write_text("")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "configs/demo.yaml", "--results-dir",
                           str(tmp_path / "a-file" / "results")], capture_output=True, text=True,
                          timeout=machine_s(120), env={**os.environ, "RAY_TMPDIR": str(tmp_path / "ray")})
    assert done.returncode == 2 and "--results-dir" in done.stderr and "cannot be written" in done.stderr
    assert not (tmp_path / "ray").exists()  # Ray never started
