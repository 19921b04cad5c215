"""The cluster side of a run: connecting to Ray (or starting a local one), checking that every cell
fits some node before anything launches, and asking a worker what the installed sglang accepts."""

from __future__ import annotations

import contextlib
import logging
import os
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
    """ray.init, with any failure to start or reach Ray as one ClusterError (exit 3, not a result)."""
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            # The node advertises loopback (workers and actors talk over 127.0.0.1); its ports still
            # listen on every interface (Ray 2.60), which is why harness.run.ray.auth turns tokens on.
            slots = {"num_gpus": gpus} if resource == "GPU" else {"num_gpus": 0, "resources": {resource: gpus}}
            ray.init(address="local", num_cpus=cpus, _node_ip_address="127.0.0.1", **slots, **kwargs)
    except Exception as error:  # noqa: BLE001 - Ray raises bare Exception, RuntimeError, ConnectionError...; none is carried on
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        hint = ("is it running, and is RAY_AUTH_MODE=token set if it uses tokens?" if address else
                "on a busy machine, try again when it is quieter, or start Ray yourself and pass --ray-address")
        raise ClusterError(f"could not start or reach {where}: {first}; {hint}") from None


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
