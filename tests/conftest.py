"""Shared fixtures: the GSM8K copy beside the checkout, one local Ray for the session, sim worlds."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"

# `make test` runs the modules on pytest-xdist workers, a whole module to one worker (--dist loadscope:
# a module's fixtures, such as the real-engine run, are made once). The long modules go out first, so
# that none of them starts last and runs alone while the other workers have finished. Seconds each
# took under `make test` on 2 quiet cores (two workers; docs/benchmarks.md, "The test suite"), or
# alone where marked.
LONGEST_FIRST = (
    "tests/real_engine/test_real_sglang.py",  # 225 s alone (session 27): seven real sglang servers, then three more
    "tests/real_engine/test_trained_model.py",  # 227 s alone: a trained model built, two real servers
    "tests/test_incident_demo.py",  # 118-176 s: 32 simulated cells, 23,000 questions
    "tests/test_benchmarks.py",  # 136 s: every benchmark's quick mode
    "tests/test_run_end_to_end.py",  # 87 s
    "tests/test_mlflow_server.py",  # 118 s: an `mlflow server`, stopped mid-run
    "tests/test_interrupt.py",  # 90 s
    "tests/test_pr_and_bisect.py",  # 95 s
    "tests/engine/test_cluster.py",  # 62 s: a second Ray node
    "tests/test_self_checks.py",  # 43 s: four simulated runs of 320 questions with their self-checks
    "tests/test_faults.py",  # 100 s
    "tests/engine/test_sglang_check.py",  # 49 s: real sglang's parser
)
# The real-engine modules go to one worker, one after the other. Each keeps both cores busy with its
# servers (one core per server): side by side on two workers (session 25's full run) they took 453 s
# and 419 s, longer than one after the other alone (session 27: 225 s + 227 s), and held both
# workers all that time.
TOGETHER = "tests/real_engine/"


def gsm8k_folder() -> Path:
    configured = os.environ.get("REGRESS_GSM8K_PATH")
    folder = Path(configured) if configured else SHARED_GSM8K
    if not (folder / "test.jsonl").is_file():
        pytest.exit(f"GSM8K not found at {folder}; set REGRESS_GSM8K_PATH to a folder with test.jsonl and "
                    "train.jsonl", returncode=2)
    return folder


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules of LONGEST_FIRST first, in that order; the rest as collected."""
    rank = {module: index for index, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under --dist loadscope: the modules under TOGETHER are one unit of work, the rest one a module.
    (Not tried again: holding back that worker's next unit until TOGETHER is done. A worker runs a
    test only once it knows the next one, so the last real-engine test waited for the other worker
    to finish everything: 1,076 s in all.)"""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TogetherScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return TOGETHER if nodeid.startswith(TOGETHER) else super()._split_scope(nodeid)

    return TogetherScheduling(config, log)


def usable_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may use: its CPU affinity, and a cgroup v2 CPU quota where one is set
    (a CI container on a large host sees all the host's cores in `os.cpu_count()`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cpu_max.read_text().split()
        if quota != "max":
            cores = min(cores, int(quota) // int(period))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker per usable core, at most 4. Each worker starts its own local Ray and
    servers, and beyond 4 the longest module (the real-engine run) bounds the wall time anyway."""
    return min(usable_cores(), 4)


@pytest.fixture(scope="session", autouse=True)
def _gsm8k_env() -> Path:
    folder = gsm8k_folder()
    os.environ["REGRESS_GSM8K_PATH"] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def _regress_cache(tmp_path_factory) -> Path:
    """One cache for the session (the MLflow schema template every fresh SQLite store is copied
    from), not the user's ~/.cache: built once by the first test that opens a store."""
    folder = tmp_path_factory.mktemp("regress-cache")
    os.environ["REGRESS_CACHE_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def gsm8k(_gsm8k_env: Path):
    from harness.benchmark.gsm8k.dataset import load_gsm8k

    return load_gsm8k(_gsm8k_env)


def _start_local_ray() -> None:
    import logging

    import ray

    from harness.run.ray.cluster import LOCAL_SYSTEM_CONFIG, start_local

    # 8 declared GPUs for the simulated suites, 2 CPU slots for the real-engine ones (cluster.platform: cpu).
    # Tried again on a busy machine, as `regress run` starts its own.
    start_local(lambda: ray.init(address="local", num_cpus=2, num_gpus=8, resources={"regress_cpu_slot": 2},
                                 include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                                 _node_ip_address="127.0.0.1", _system_config=LOCAL_SYSTEM_CONFIG))


def _local_ray_alive() -> bool:
    import ray

    if not ray.is_initialized():
        return False
    try:
        return any(node.get("Alive") and node.get("Resources", {}).get("GPU") for node in ray.nodes())
    except Exception:  # noqa: BLE001 - a driver whose cluster is gone raises whatever Ray raises
        return False


@pytest.fixture(scope="session")
def _ray_session():
    """One local Ray with 8 declared GPUs for the session's worker (start-up costs ~2.5 s)."""
    import ray

    _start_local_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session, request):
    """The session's local Ray, checked alive as each module that needs it begins. Once in a full
    `make test` (CI stop 46) a module found the worker's Ray with no alive GPU node and its cells
    waited `cluster.wait_for_nodes_s`: `start_local`'s retry test had shut down the Ray this worker
    had connected (fixed in session 24: a failed try shuts down only what it started). A dead one
    is still started again, with a warning naming the module, so that one module's leftovers cost
    no other module's test."""
    import warnings

    import ray

    if not _local_ray_alive():
        warnings.warn(f"the session's local Ray had no alive GPU node as {request.node.nodeid} began "
                      "(an earlier module on this worker left it so); started again", stacklevel=1)
        with contextlib.suppress(Exception):
            ray.shutdown()
        _start_local_ray()
    return ray


@pytest.fixture()
def python() -> str:
    return sys.executable


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
