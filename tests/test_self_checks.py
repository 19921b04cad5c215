"""Evidence inside each cell, through `regress run` on the simulator: one world per bug class of
2025-26 that a cold pass against a reference misses or blames on the wrong cell."""

from __future__ import annotations

import json

import pytest
import yaml

from harness.records import CellResult
from tests.helpers import INCIDENT_WORLD
from tests.test_run_end_to_end import run_simulated


def world_with(tmp_path, bug: dict, latency: float = 0.0):
    """The incident world with `bug` as its only bug (and `latency` per request), written to tmp_path."""
    world = yaml.safe_load(INCIDENT_WORLD.read_text())
    world["bugs"] = [bug]
    world["latency"]["base_s"] = latency
    (tmp_path / "world.yaml").write_text(yaml.safe_dump(world))
    return tmp_path / "world.yaml"


def run_with_bug(tmp_path, bug: dict, latency: float = 0.0) -> dict[str, CellResult]:
    _, _, cells = run_simulated(tmp_path, "inside", {"attention_backend": ["triton", "fa3"]},
                                world_with(tmp_path, bug, latency), num_questions=320, concurrency=32,
                                gate={"self_checks": {"questions": 32}, "early_stop_share": 0.0001})
    return cells


@pytest.mark.slow
def test_a_cell_right_cold_and_wrong_warm_fails_its_replay(ray_local, tmp_path):
    """sglang PR #16053's class: the first pass is right; asked again with its prompt cached, wrong."""
    cells = run_with_bug(tmp_path, {"name": "warm", "when": {"attention_backend": "fa3"}, "trigger": "warm",
                                    "corrupt_probability": [0.9, 0.9], "style": "wrong"})
    cell, reference = cells["dsv2.ab-fa3"], cells["dsv2.ab-triton"]
    assert cell.status.value == "fail" and "self-check replay" in cell.reason and cell.self_check_p["replay"] < 1e-4
    assert "self-check replay" in reference.reason and reference.status.value != "fail"


@pytest.mark.slow
def test_a_cell_whose_answers_depend_on_their_batch_fails_its_co_batch_check(ray_local, tmp_path):
    """Cross-request contamination that moves only the log-probabilities: alone, the same request is clean."""
    cells = run_with_bug(tmp_path, {"name": "batch", "when": {"attention_backend": "fa3"}, "trigger": "batched",
                                    "corrupt_probability": [0.9, 0.9], "style": "unchanged"}, latency=0.02)
    cell = cells["dsv2.ab-fa3"]
    assert cell.status.value == "fail" and cell.self_check_p["co-batch"] < 1e-4, cell.reason
    assert cells["dsv2.ab-triton"].self_check_p["co-batch"] > 0.01


def test_a_cell_wrong_only_where_a_prompt_reads_its_own_decoded_rows_fails_its_decode_check(ray_local, tmp_path):
    """The decode-cache-hit class (sglang's kl_test_utils): rows a decode wrote, read back by a later
    request from the cache, are wrong. The evaluation, the teacher text and the replay never read
    them; the decode check's follow-up does, and its decoded numbers leave a prefill's."""
    cells = run_with_bug(tmp_path, {"name": "decoded", "when": {"attention_backend": "fa3"}, "trigger": "decode_hit",
                                    "corrupt_probability": [0.9, 0.9], "style": "unchanged"})
    cell, reference = cells["dsv2.ab-fa3"], cells["dsv2.ab-triton"]
    assert cell.status.value == "fail" and cell.failed == ["self-check decode"], cell.reason
    assert cell.self_check_p["decode"] < 1e-4 and "32 follow-ups read their answer's decoded KV" in cell.reason
    assert reference.status.value == "pass" and reference.self_check_p["decode"] > 0.01, reference.reason


def test_a_broken_reference_is_named_and_the_healthy_cell_is_not_blamed(ray_local, tmp_path):
    """The reference's prefix-cache hits read the wrong KV rows (only log-probabilities move): against
    it the healthy cell diverges. The reference fails its own cache check (warm against cold), so
    the healthy cell is `inconclusive` with "reference broken", never `fail`."""
    cells = run_with_bug(tmp_path, {"name": "kv", "when": {"attention_backend": "triton"}, "trigger": "prefix_hit",
                                    "corrupt_probability": [0.9, 0.9], "style": "unchanged"})
    reference, cell = cells["dsv2.ab-triton"], cells["dsv2.ab-fa3"]
    assert reference.status.value == "fail" and reference.self_check_p["cache"] < 1e-4, reference.reason
    assert cell.status.value == "inconclusive" and "reference broken: dsv2.ab-triton is fail" in cell.reason
    assert cell.self_check_p["cache"] > 0.01  # its own cache is consistent


def test_a_reference_all_its_cells_diverge_from_alike_is_named_broken(ray_local, tmp_path):
    """The reference's numbers are off on every request (no cache involved: its self-checks cannot
    see it); its two cells diverge from it alike and agree with each other: the reference is the
    failing cell, its cells are `inconclusive` ("reference broken"), and attribution points at it."""
    world = world_with(tmp_path, {"name": "numbers", "when": {"attention_backend": "triton"}, "trigger": "always",
                                  "corrupt_probability": [0.9, 0.9], "style": "unchanged"})
    result, run_dir, cells = run_simulated(tmp_path, "named", {"attention_backend": ["triton", "fa3", "flashinfer"]},
                                           world, num_questions=60)
    reference = cells["dsv2.ab-triton"]
    assert reference.status.value == "fail" and reference.failed == ["reference broken"], reference.reason
    assert "all 2 of its cells diverge from it" in reference.reason and "agree with one another" in reference.reason
    for cell_id in ("dsv2.ab-fa3", "dsv2.ab-flashinfer"):
        assert cells[cell_id].status.value == "inconclusive" and "reference broken" in cells[cell_id].reason
    run = json.loads((run_dir / "run.json").read_text())
    assert run["attribution"] == "attention_backend=triton" and result.exit_code == 1
