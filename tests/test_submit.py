"""`regress submit` against a real local Ray cluster with the Jobs API (dashboard on loopback)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from harness.engine.ports import free_port
from harness.run.ray.jobs import Submission, entrypoint, runtime_env_for
from tests.helpers import ROOT, machine_s
from tests.test_faults import processes_mentioning

RAY = str(Path(sys.executable).parent / "ray")


def test_entrypoint_is_quoted_and_relative_to_the_working_dir():
    submission = Submission(address="http://h:8265", suite_path=ROOT / "configs" / "demo.yaml",
                            run_args=["--select", "model=kimi-linear; rm -rf /"], runtime_env={"env_vars": {"A": "1"}},
                            working_dir=ROOT)
    assert entrypoint(submission) == ("python -m harness.cli run configs/demo.yaml --ray-address auto "
                                      "--select 'model=kimi-linear; rm -rf /' --results-dir /var/tmp/regress-results")
    # Results go where the user says, never into the job's temporary working directory by default.
    mine = Submission(address="http://h:8265", suite_path=Path("configs/demo.yaml"), runtime_env={},
                      run_args=["--results-dir", "/data/results"], working_dir=ROOT)
    assert entrypoint(mine).endswith("--ray-address auto --results-dir /data/results")
    env = runtime_env_for(submission)
    assert env["env_vars"] == {"A": "1"} and env["working_dir"] == str(ROOT) and ".venv" in env["excludes"]


def cluster_processes(ray_tmp: str) -> set[int]:
    """The processes of the cluster under `ray_tmp`: those that carry it in their environment, and
    those that hold a file under it open (the dashboard agent does not carry RAY_TMPDIR; left
    running without its raylet, it spun a core at ~75% for over a minute)."""
    found = set(processes_mentioning(ray_tmp))
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{entry}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{entry}/fd/{fd}").startswith(ray_tmp):
                            found.add(int(entry))
                            break
    return found


@pytest.mark.slow
def test_submit_runs_the_suite_as_a_ray_job_and_returns_its_exit_code(tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # Unix socket paths must stay under 108 bytes
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "token"}
    # Every port chosen here: another Ray on this machine (the test session's) holds the defaults,
    # and a job agent that cannot bind its port leaves the Jobs API without an agent.
    port, gcs, agent, metrics, runtime_env_agent = (str(free_port()) for _ in range(5))
    start = subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", gcs,
                            "--num-cpus", "2", "--num-gpus", "8", "--include-dashboard", "true",
                            "--dashboard-host", "127.0.0.1", "--dashboard-port", port,
                            "--dashboard-agent-listen-port", agent, "--metrics-export-port", metrics,
                            "--runtime-env-agent-port", runtime_env_agent, "--disable-usage-stats"],
                           env=env, capture_output=True, text=True, timeout=machine_s(120))
    assert start.returncode == 0, start.stderr[-2000:]
    # A suite with a runtime_env of its own: the job gets it, and the job's driver must not pass it
    # to Ray again (Ray 2.60 refuses to merge the same fields twice).
    work = tmp_path / "work"
    work.mkdir()
    suite = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    suite["sim_world"] = str(ROOT / "configs" / "sim" / "incident.yaml")
    suite["cluster"]["runtime_env"] = {"env_vars": {"REGRESS_SUBMIT_MARKER": "1"}}
    (work / "demo.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    try:
        result = subprocess.run(
            [str(Path(sys.executable).parent / "regress"), "submit", str(work / "demo.yaml"), "--working-dir",
             str(work), "--address", f"http://127.0.0.1:{port}", "--python", sys.executable, "--select",
             "model=kimi-linear,attention_backend=fa3,unified_memory=on,radix_cache=on",
             "--num-questions", "30", "--no-tracking", "--results-dir", str(tmp_path / "results")],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=machine_s(300))
    finally:
        # Only this cluster's processes: `ray stop` would also stop the test session's own Ray, and
        # every later test on it would lose its driver.
        for pid in cluster_processes(ray_tmp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "submitted Ray job" in result.stdout
    assert "kimi-linear.ab-fa3.um-on.rc-on" in result.stdout  # the job's log, streamed
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert list((tmp_path / "results").glob("demo-*/cells.jsonl"))
