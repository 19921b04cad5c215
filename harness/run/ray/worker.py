"""What runs on the GPU node for one cell: launch, verify, evaluate, stop. Returns a CellOutcome."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import ray

from harness.engine.launch import LaunchSpec
from harness.engine.server import ServerProcess
from harness.engine.verify import mismatches
from harness.errors import InfraError, ServerError
from harness.gate.sequential import EarlyStop
from harness.gsm8k.evaluator import EvalSettings, evaluate
from harness.gsm8k.protocol import ProtocolPlan
from harness.results.records import CellOutcome, ServerInfo, Timings

LOG_LIMIT_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class CellJob:
    spec: LaunchSpec
    settings: EvalSettings
    queued_at: float  # driver's wall clock when the cell was submitted
    stall_timeout_s: float = 300.0
    early_stop: EarlyStop | None = None


def _read_log(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - LOG_LIMIT_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return text if size <= LOG_LIMIT_BYTES else "[... log truncated ...]\n" + text


async def run_cell(job: CellJob, plan: ProtocolPlan, log_dir: Path) -> tuple[CellOutcome, str]:
    """Launch the cell's server, check its resolved config, run GSM8K, stop it. Never raises
    for infrastructure failures: they come back as an outcome with `error` set."""
    started = time.time()
    cell = job.spec.cell
    log_path = log_dir / f"{cell.cell_id}.log"
    node = node_id()
    # The server is told which Ray node it runs on (the simulator keeps its page cache per node).
    spec = replace(job.spec, env={**job.spec.env, "REGRESS_NODE_ID": node})
    server = ServerProcess(spec, log_path)
    devices = {**os.environ, **spec.environment()}.get("CUDA_VISIBLE_DEVICES")  # what the server sees
    info = ServerInfo(cuda_visible_devices=devices, node=node)
    timings: dict[str, float] = {"queued_s": max(0.0, started - job.queued_at), "started_at": started}
    try:
        async with server:
            timings["startup_s"] = server.startup_s
            raw_info = await server.server_info()
            version = raw_info.get("version")
            info = info.model_copy(update={"version": None if version is None else str(version), "port": server.port,
                                           "resolved": raw_info})
            problems = mismatches(cell.expected, raw_info, server.argv)
            if problems:
                outcome = CellOutcome(cell_id=cell.cell_id, args=server.argv, server=info, mismatches=problems)
            else:
                last_progress = time.monotonic()

                def on_progress(_: object) -> None:
                    nonlocal last_progress
                    last_progress = time.monotonic()

                stop_reason: list[str] = []

                def should_stop(records: list) -> bool:
                    reason = job.early_stop.check(records) if job.early_stop else None
                    if reason:
                        stop_reason.append(reason)
                    return reason is not None

                score, records = await server.guard(
                    evaluate(server.base_url, plan, job.settings, on_progress=on_progress, should_stop=should_stop),
                    progress=lambda: last_progress, stall_timeout_s=job.stall_timeout_s)
                timings["eval_s"] = score.eval_s
                outcome = CellOutcome(cell_id=cell.cell_id, args=server.argv, server=info, score=score,
                                      questions=records, stopped_early=stop_reason[0] if stop_reason else None)
    except ServerError as error:
        outcome = CellOutcome(cell_id=cell.cell_id, args=server.argv, server=info, error=str(error),
                              log_tail=error.log_tail)
    except InfraError as error:
        outcome = CellOutcome(cell_id=cell.cell_id, args=server.argv, server=info, error=str(error))
    if server.leftover_pids:
        outcome = outcome.model_copy(update={"error": outcome.error or
                                             f"server processes survived the stop: {server.leftover_pids}"})
    timings["ended_at"] = time.time()
    timings["total_s"] = timings["ended_at"] - started + timings["queued_s"]
    outcome = outcome.model_copy(update={"timings": Timings(**timings)})
    return outcome, _read_log(log_path)


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
        # Ray's assignment, not CUDA_VISIBLE_DEVICES: a cluster may tell Ray not to set it.
        return {"node": node_id(), "gpu": ",".join(str(gpu) for gpu in ray.get_gpu_ids())}

    def vigil(self) -> None:
        """Never returns: the driver waits on it to learn at once that an idle slot died."""
        threading.Event().wait()

    def run(self, job: CellJob, plan: ProtocolPlan) -> tuple[CellOutcome, str]:
        with tempfile.TemporaryDirectory(prefix="regress-cell-") as log_dir:
            return asyncio.run(run_cell(job, plan, Path(log_dir)))
