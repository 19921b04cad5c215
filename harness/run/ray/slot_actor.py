"""The actor that holds one GPU (or CPU slot) for the driver: `GpuSlot`.

Kept apart from the pool (`harness.run.ray.slots`) and light on imports: Ray imports this module in
every slot's worker process, and most slots never run a cell (the k-1 that hold a tp-k cell's other
GPUs, the idle ones), so only a slot that runs one imports the cell's code (`run`)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import ray

if TYPE_CHECKING:
    from harness.benchmark.base import ProtocolPlan
    from harness.records import CellOutcome
    from harness.run.cell import CellJob


def node_id() -> str:
    """The Ray node this runs on (hostnames repeat on simulated clusters), else the hostname."""
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside a Ray worker there is no runtime context
        return socket.gethostname()


@ray.remote(num_cpus=0, num_gpus=1, max_restarts=0, max_concurrency=3)
class GpuSlot:
    """Holds one GPU for the driver from the moment Ray places it until the driver lets it go, so
    cells start without waiting for a worker process, on GPUs the driver chose (see `packing`).

    A tp-k cell runs in one of its k slots (the leader) with CUDA_VISIBLE_DEVICES naming all k;
    the other k-1 hold their GPUs idle meanwhile. The server is the leader's child and carries a
    parent-death signal, so killing the leader kills the server: one dead slot costs one cell.
    Threads: `run` in one, `vigil` in another (the thread that started a server lives as long as
    the actor, which is what PR_SET_PDEATHSIG watches)."""

    def where(self) -> dict[str, str | None]:
        # Ray's assignment, not CUDA_VISIBLE_DEVICES: a cluster may tell Ray not to set it. A CPU
        # slot has no device id from Ray (None): the pool numbers its slots itself.
        gpus = ray.get_gpu_ids()
        return {"node": node_id(), "gpu": ",".join(str(gpu) for gpu in gpus) if gpus else None}

    def vigil(self) -> None:
        """Never returns: the driver waits on it to learn at once that an idle slot died."""
        threading.Event().wait()

    def run(self, job: CellJob, plan: ProtocolPlan) -> tuple[CellOutcome, str]:
        import asyncio
        import os
        import tempfile

        from harness.engine.orphans import kill_orphaned_servers
        from harness.run.cell import run_cell

        # What slots killed on this node left behind: server processes that outlived their parent-death
        # signal, and log folders.
        kill_orphaned_servers()
        sweep_orphaned_log_folders(Path(tempfile.gettempdir()))
        with tempfile.TemporaryDirectory(prefix=f"{LOG_FOLDER_PREFIX}{os.getpid()}-") as log_dir:
            return asyncio.run(run_cell(job, plan, Path(log_dir), node_id()))


LOG_FOLDER_PREFIX = "regress-cell-"  # then the slot's pid, a dash, and tempfile's random part


def log_folder_pid(path: Path) -> int | None:
    """The pid of the slot that made this cell log folder (None for a name not of that form)."""
    pid = path.name[len(LOG_FOLDER_PREFIX):].split("-", 1)[0]
    return int(pid) if path.name.startswith(LOG_FOLDER_PREFIX) and pid.isdigit() else None


def orphaned_log_folders(folder: Path) -> list[Path]:
    """The cell log folders in `folder` whose slot process is gone. A slot killed mid-cell (a
    fail-fast or interrupted run stops its running cells; a lost worker) never leaves its `with`, so
    its folder and the server's whole log in it stay on the node. A folder whose process still runs
    (or whose owner this process may not signal) is not one."""
    import os

    from harness.engine.orphans import process_exists

    return [path for path in folder.glob(f"{LOG_FOLDER_PREFIX}*-*")
            if (pid := log_folder_pid(path)) is not None and pid != os.getpid() and not process_exists(pid)]


def sweep_orphaned_log_folders(folder: Path) -> None:
    """Remove the log folders of slots that are gone (`orphaned_log_folders`): the next cell run on
    a node cleans up after the slots killed there."""
    import shutil

    for path in orphaned_log_folders(folder):
        shutil.rmtree(path, ignore_errors=True)
