"""On a 2-node cluster with 4 GPUs each: no two live servers share a GPU, and no server survives,
also after a Ray worker is killed mid-cell (that cell is retried once and completes)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from harness.engine.server import group_members
from tests.helpers import ROOT


@pytest.mark.slow
def test_mixed_tp_run_on_two_nodes(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "tests.scenarios.cluster_run", str(tmp_path)], cwd=ROOT,
                               capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    cells = [c for c in report["cells"] if c["status"] != "skipped"]
    assert len(cells) == 16 and len(report["cells"]) == 24 and report["killed_once"]
    assert {c["status"] for c in cells} == {"pass"}, [(c["cell_id"], c["reason"][:200]) for c in cells]
    tp = {"dsv2": 1, "kimi": 2, "dense": 4}
    for cell in cells:
        assert len(cell["cuda_visible_devices"].split(",")) == tp[cell["model"]]
    assert len({c["node"] for c in cells}) == 2
    for a, b in itertools.combinations(cells, 2):
        overlap = a["timings"]["started_at"] < b["timings"]["ended_at"] and b["timings"]["started_at"] < a["timings"]["ended_at"]
        if a["node"] == b["node"] and overlap:
            assert not set(a["cuda_visible_devices"].split(",")) & set(b["cuda_visible_devices"].split(",")), (a, b)
    # 16 cells plus the retried one: 17 servers were started, and none is left.
    assert len(report["servers"]) == 17
    for server in report["servers"]:
        assert group_members(server["pgid"]) == []
