"""The cluster side of a run: connecting to Ray (or starting a local one), checking that every cell
fits some node before anything launches, and asking a worker what the installed sglang accepts."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from harness.engine.engines import engine_of
from harness.engine.launch import default_python
from harness.errors import ClusterError, ConfigError, InfraError
from harness.suite.axes import backend_axes
from harness.suite.config import LoadedSuite
from harness.suite.matrix import Matrix, expand, select

# A local cluster is one node on this machine: no network to partition, and no other node to take
# its cells. Ray's GCS marks a raylet dead after 5 missed health checks (3 s apart, 10 s timeout),
# which a raylet starved of CPU on a loaded 2-core machine can miss (measured here: a raylet paused
# 70 s is marked dead for good and every cell waits `cluster.wait_for_nodes_s`, then ends in
# `error`); 100 missed checks (~5 min) keep it.
LOCAL_SYSTEM_CONFIG = {"health_check_failure_threshold": 100}


@contextlib.contextmanager
def ray_cluster(suite: LoadedSuite, address: str | None) -> Iterator[None]:
    """Connect to `address`, or start a local Ray that declares the suite's GPU count (with token
    authentication when `regress` started this process: harness.run.ray.auth)."""
    spec = suite.suite.cluster
    address = address or spec.address
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "logging_level": logging.WARNING, "configure_logging": True}
    # A Ray Job's driver already runs in the job's runtime env (`regress submit` gives it the suite's);
    # passing the same fields again makes Ray 2.60 refuse to merge them.
    if spec.runtime_env and "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:
        kwargs["runtime_env"] = spec.runtime_env
    already = ray.is_initialized()
    if not already:
        _connect(address, spec.gpus, spec.cpus, kwargs, spec.slot_resource)
    try:
        yield
    finally:
        if not already:
            ray.shutdown()


def _connect(address: str | None, gpus: int, cpus: int | None, kwargs: dict[str, Any], resource: str = "GPU") -> None:
    """ray.init, with any failure to start or reach Ray as one ClusterError (exit 3, not a result).
    A local cluster is started with `start_local` (tried again on a busy machine)."""
    if not address:
        # The node advertises loopback (workers and actors talk over 127.0.0.1); its ports still
        # listen on every interface (Ray 2.60), which is why harness.run.ray.auth turns tokens on.
        slots = {"num_gpus": gpus} if resource == "GPU" else {"num_gpus": 0, "resources": {resource: gpus}}
        start_local(lambda: ray.init(address="local", num_cpus=cpus, _node_ip_address="127.0.0.1",
                                     _system_config=LOCAL_SYSTEM_CONFIG, **slots, **kwargs))
        return
    try:
        ray.init(address=address, **kwargs)
    except Exception as error:  # noqa: BLE001 - Ray raises bare Exception, RuntimeError, ConnectionError...; none is carried on
        raise ClusterError(f"could not start or reach the Ray cluster at {address}: {_first_line(error)}; is it "
                           "running, and is RAY_AUTH_MODE=token set if it uses tokens?") from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def start_attempts(cores: int | None = None, load: float | None = None) -> int:
    """How many times a local Ray start is tried: Ray 2.60 gives its raylet a fixed 30 s to register
    (node.py; no setting changes it), which a loaded machine can miss. Two tries on a quiet machine,
    one more per unit of load per core (the 1-minute load average), at most five."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load is None:
        load = _load()
    return max(2, min(5, 2 + int(load / max(cores, 1))))


def start_local(start: Callable[[], Any], attempts: int | None = None, cleanup: Callable[[], None] | None = None) -> Any:
    """Run `start` (a local Ray start: `ray.init(address="local", ...)`, or a test cluster's), trying
    again while it fails, up to `start_attempts()` times; between tries, Ray is shut down and the
    processes the failed try left behind (its GCS, raylet and their workers, children of this
    process) are killed. A Ray this process had connected before is left alone: only what the failed
    try started is shut down. The last failure becomes one ClusterError (exit 3)."""
    tries = attempts or start_attempts()
    began = time.monotonic()
    connected = ray.is_initialized()
    for attempt in range(1, tries + 1):
        before = _descendants(os.getpid())
        try:
            return start()
        except Exception as error:  # noqa: BLE001 - Ray raises bare Exception, RuntimeError...; retried, then one error
            if not connected:
                with contextlib.suppress(Exception):
                    ray.shutdown()
            if cleanup is not None:
                with contextlib.suppress(Exception):
                    cleanup()
            _kill(_descendants(os.getpid()) - before)
            if attempt == tries:
                raise ClusterError(
                    f"could not start a local Ray cluster ({tries} tries in {time.monotonic() - began:.0f} s; the "
                    f"machine's load average {_load():.1f} on {os.cpu_count()} cores): {_first_line(error)}; start "
                    "Ray yourself (`ray start --head`) and pass --ray-address, or run when the machine is "
                    "quieter") from None
            time.sleep(min(2.0 * attempt, 10.0))
    raise AssertionError("unreachable")


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def _descendants(root: int) -> set[int]:
    """Every process below `root` (read from /proc; empty where there is none)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            parents[int(stat.parent.name)] = int(text[text.rindex(")") + 2:].split()[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@ray.remote(num_cpus=0)
def _accepted_backends(probe: str, python: str | None, env: dict[str, str], engine: str) -> tuple[str, ...]:
    from harness.engine.discover import accepted_attention_backends

    return accepted_attention_backends(probe, default_python(python), env, engine=engine)  # the worker's interpreter


def expand_auto(loaded: LoadedSuite, selection: str | None, data_source: str | None) -> Matrix | None:
    """If an attention axis says `auto`, re-expand with what the cluster's sglang accepts (read on a
    worker with the first model's environment); None when no axis says `auto`."""
    spec = loaded.suite
    if not any(axis in backend_axes() and "auto" in values for axis, values in spec.axes.items()):
        return None
    engine = engine_of(loaded)
    env = {**engine.environment(loaded, data_source), **spec.models[0].env}
    backends = ray.get(_accepted_backends.remote(engine.backends_probe, spec.python, env, spec.engine))
    return select(expand(spec, tuple(backends)), selection)


@ray.remote(num_cpus=0)
def _check_on_worker(python: str | None, loaded: LoadedSuite, cells: list, models_dir: Path,
                     env: dict[str, str], request: list[dict]) -> list:
    from harness.engine.check import check_cells

    return check_cells(default_python(python), loaded, cells, models_dir, env=env, request=request)  # the worker's sglang


def sglang_check(loaded: LoadedSuite, matrix: Matrix, data_source: str | None,
                 warn: Callable[[str], None]) -> tuple[Matrix, dict[str, dict]]:
    """Ask the sglang the workers will run which cells it refuses, before any GPU is held: those are
    `skipped` with sglang's message. Returns the matrix left and each cell's predicted fields. A check
    that cannot run (no sglang on the worker yet, say) is a warning, never a reason to stop."""
    from harness.engine.check import MODELS_DIR, check_groups, check_request, without_refused

    spec = loaded.suite
    options = {"runtime_env": spec.cluster.runtime_env} if spec.cluster.runtime_env else {}
    # One check per environment the cells run in (most suites: one), all at once: each imports sglang
    # in a process of its own (~7 CPU-seconds here); one after another they held up the first cell.

    def skipped(cells: list, error: Exception) -> None:
        models = ", ".join(dict.fromkeys(cell.model.id for cell in cells))
        warn(f"sglang check skipped for {models}: {str(error).strip().splitlines()[-1][:300]}")

    refs = []
    for env, cells in check_groups(list(matrix.cells), engine_of(loaded).environment(loaded, data_source)):
        try:
            refs.append((cells, _check_on_worker.options(**options).remote(spec.python, loaded, cells, MODELS_DIR,
                                                                          env, check_request(loaded, cells))))
        except (ConfigError, InfraError, RayError) as error:
            skipped(cells, error)
    checked = []
    for cells, ref in refs:
        try:
            checked += ray.get(ref)
        except (ConfigError, InfraError, RayError) as error:
            skipped(cells, error)
    return without_refused(matrix, checked), {c.cell_id: c.predicted for c in checked if c.predicted}


def check_fits(matrix: Matrix, resource: str = "GPU") -> None:
    """Refuse cells that no node can hold (in slots of `resource`: GPUs or CPU slots), before
    anything is launched."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    largest = max((int(n["Resources"].get(resource, 0)) for n in nodes), default=0)
    what = "GPUs" if resource == "GPU" else f"slots of {resource}"
    types = {key.split(":", 1)[1] for n in nodes for key in n["Resources"] if key.startswith("accelerator_type:")}
    for cell in matrix.cells:
        if cell.gpus > largest:
            raise ConfigError(f"models[{cell.model.id}].tp: {cell.gpus} {what} asked by {cell.cell_id}, but the "
                              f"largest node has {largest}; an actor never spans nodes")
        if cell.model.gpu_type and cell.model.gpu_type not in types:
            raise ConfigError(f"models[{cell.model.id}].gpu_type: no node has {cell.model.gpu_type!r}; "
                              f"nodes have: {', '.join(sorted(types)) or 'no accelerator type'}")
