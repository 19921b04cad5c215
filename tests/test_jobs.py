"""The CI job script's verdict: a broken night is not green, a regression is red, and the report
says which in its first line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.analysis.assess import assess
from harness.records import CellResult, Status
from tests.helpers import INCIDENT_WORLD, ROOT, machine_s
from tests.records import result as a_result


def result(cell_id: str, status: Status, reference: str | None = "ref") -> CellResult:
    return a_result(cell_id, status, reference_cell=reference)


def test_errors_on_a_reference_or_above_the_share_make_a_broken_run():
    ok = [result("ref", Status.PASS, None), *(result(f"c{i}", Status.PASS) for i in range(19))]
    assert assess(ok).exit_code == 0 and assess(ok).headline.startswith("GREEN: 20 of 20 cells pass")
    one_error = [*ok[:-1], result("c19", Status.ERROR)]
    assert assess(one_error).exit_code == 0 and "1 could not be measured" in assess(one_error).headline
    reference_down = [result("ref", Status.ERROR, None), *ok[1:]]
    assert assess(reference_down).exit_code == 4 and "reference cell(s) ref" in assess(reference_down).headline
    all_down = [result(f"c{i}", Status.ERROR) for i in range(5)]
    assert assess(all_down).exit_code == 4 and assess(all_down).headline.startswith("BROKEN RUN: 5 of 5")
    red = [*ok[:-1], result("c19", Status.FAIL), result("c20", Status.INCONCLUSIVE)]
    verdict = assess(red)
    assert verdict.exit_code == 1 and "c19" in verdict.headline and "1 undecided after 1 launch(es)" in verdict.headline


def test_inconclusive_cells_make_an_undecided_headline_that_names_them_and_what_would_decide_each():
    undecided = result("c1", Status.INCONCLUSIVE).model_copy(update={
        "launches": 3, "decide": "another launch (launch spread is 71% of its drop's variance vs reference)"})
    verdict = assess([result("ref", Status.PASS, None), undecided])
    # Never a plain success: exit 3, which the CI workflows turn into a neutral check.
    assert verdict.exit_code == 3 and verdict.headline.startswith("UNDECIDED: 1 of 2 cells pass")
    assert ("1 undecided after 3 launch(es) and the questions the suite allows: c1 (another launch (launch spread "
            "is 71%") in verdict.headline


def job(tmp_path: Path, fault_when: dict) -> subprocess.CompletedProcess:
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["faults"] = [{"name": "down", "when": fault_when, "startup_exit_code": 1}]
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    suite = {"suite": "night", "engine": "sim", "sim_world": str(tmp_path / "world.yaml"), "num_questions": 20,
             "stop_grace_s": 1, "models": [{"id": "dsv2", "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "floor": 0.5}],
             "axes": {"attention_backend": ["triton", "fa3"]}}
    (tmp_path / "night.yaml").write_text(yaml.safe_dump(suite))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "RESULTS_DIR": str(tmp_path / "results")}
    env.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run(["bash", "jobs/run_and_report.sh", str(tmp_path / "night.yaml"), "nightly", "--no-tracking"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=machine_s(600))


@pytest.mark.slow
def test_a_night_whose_reference_cannot_be_measured_fails_the_job(tmp_path):
    """Through the script: the retry of errored cells, assess, the report. (Every cell down takes the
    same path; `assess` itself is tested on both above.)"""
    completed = job(tmp_path, {"attention_backend": "triton"})
    assert completed.returncode == 4, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "BROKEN RUN" in completed.stdout and "running them once more" in completed.stderr
    (run_dir,) = (tmp_path / "results").glob("night-*")
    assert (run_dir / "report.md").read_text().startswith("**BROKEN RUN**: `")
