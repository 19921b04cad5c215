"""On a 2-node cluster with 4 GPUs each: no two live servers share a GPU, and no server survives,
also after a Ray worker is killed mid-cell (that cell is retried once and completes)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from harness.engine.orphans import group_members
from tests.helpers import ROOT, machine_s


@pytest.mark.slow
def test_mixed_tp_run_on_two_nodes(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "tests.scenarios.cluster_run", str(tmp_path)], cwd=ROOT,
                               capture_output=True, text=True, timeout=machine_s(600), env={**os.environ, "PYTHONPATH": str(ROOT)})
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


LOCAL_RAY = """
import json, subprocess, sys
from harness.run.ray.auth import require_token_auth
require_token_auth()  # what `regress` does first
import ray
from harness.run.ray.cluster import ray_cluster
from harness.suite.config import load_suite
from ray._private.authentication.authentication_utils import is_token_auth_enabled
with ray_cluster(load_suite("configs/demo.yaml"), None):
    address = ray.get_runtime_context().gcs_address
    # Two tries, not Ray's twenty (one a second): refused is refused, and the reason is checked below.
    stranger = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={address!r}); print('in')"],
                              capture_output=True, text=True, timeout=120,
                              env={**clean, "RAY_NUM_REDIS_GET_RETRIES": "2"})
    print(json.dumps({"token": is_token_auth_enabled(), "stranger_rc": stranger.returncode,
                      "stranger_in": "in" in stranger.stdout, "stranger_refused": "InvalidAuthToken" in stranger.stderr}))
"""


def test_a_local_ray_requires_a_token_that_only_the_run_holds(tmp_path):
    """Ray 2.60 listens on every interface whatever the node address, and authenticates nothing by
    default: `regress` turns token authentication on before Ray starts, with a token no file holds,
    so a process without it (another user, another machine) cannot join the local cluster."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    clean["HOME"] = str(tmp_path)  # no token file of the user's
    script = "clean = " + repr(clean) + LOCAL_RAY
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=machine_s(300),
                          env=clean)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["token"] is True and not found["stranger_in"] and found["stranger_rc"] != 0, done.stdout
    assert found["stranger_refused"], done.stdout  # turned away for its missing token, not for a wrong address
    assert not (tmp_path / ".ray" / "auth_token").exists()  # the token lived in the run's environment only


def test_a_ray_without_authentication_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "configs/demo.yaml", "--results-dir",
                           str(tmp_path / "r"), "--no-tracking"], cwd=ROOT, capture_output=True, text=True,
                          timeout=machine_s(120), env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 2 and "RAY_AUTH_MODE=disabled" in done.stderr and "Traceback" not in done.stderr


def test_a_local_ray_start_that_fails_is_tried_again_and_its_leftovers_are_killed(ray_local):
    """Ray 2.60 gives its raylet a fixed 30 s to register; on a loaded machine it can miss them.
    A failed try is cleaned up (the processes it started are killed) and tried again; the last
    failure is one ClusterError naming the tries, never a traceback. A Ray the process had
    connected before stays connected (it shut down the test session's own Ray on this worker, and
    the next module found no node: the `ray_local` warning of CI stop 46 and session 24's runs)."""
    from harness.errors import ClusterError
    from harness.run.ray.cluster import start_attempts, start_local

    left: list[subprocess.Popen] = []

    def flaky():
        left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))  # a "raylet" left behind
        if len(left) < 2:
            raise Exception("The current node timed out during startup. This could happen because ...")
        return "started"

    assert start_local(flaky, attempts=3) == "started" and len(left) == 2
    assert left[0].wait(timeout=machine_s(10)) == -9  # the failed try's process was killed
    left[1].kill()
    left[1].wait()

    def never():
        raise Exception("The current node timed out during startup.")

    with pytest.raises(ClusterError, match=r"could not start a local Ray cluster \(2 tries in .* The current node timed"):
        start_local(never, attempts=2)
    assert ray_local.is_initialized() and any(node["Alive"] for node in ray_local.nodes())
    assert start_attempts(cores=2, load=0.0) == 2 and start_attempts(cores=2, load=4.5) == 4
    assert start_attempts(cores=2, load=40) == 5


BUSY = "import time\nwhile True: pass\n"


@pytest.mark.slow
def test_a_local_ray_starts_beside_cpu_bound_processes(tmp_path):
    """What a new user's first command does on a busy laptop: the local cluster starts with two
    CPU-bound processes per core running beside it."""
    cores = len(os.sched_getaffinity(0))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2 * cores)]
    try:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        script = ("from harness.run.ray.auth import require_token_auth\nrequire_token_auth()\nimport ray\n"
                  "from harness.run.ray.cluster import ray_cluster\nfrom harness.suite.config import load_suite\n"
                  "with ray_cluster(load_suite('configs/demo.yaml'), None):\n"
                  "    print('GPUs', ray.cluster_resources().get('GPU'))\n")
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                              timeout=machine_s(600), env={**clean, "HOME": str(tmp_path)})
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert done.returncode == 0 and "GPUs 8.0" in done.stdout, done.stderr[-2000:]
