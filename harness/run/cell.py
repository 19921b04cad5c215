"""What runs on the GPU node for one cell: launch, verify, evaluate, stop. Returns a CellOutcome.

No Ray here: a Ray slot (`harness.run.ray.slot_actor.GpuSlot`) calls `run_cell` with the node it runs on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from harness.benchmark.base import ProtocolPlan
from harness.benchmark.evaluator import EvalSettings, evaluate
from harness.engine.launch import LaunchSpec
from harness.engine.server import ServerProcess
from harness.engine.verify import exercise_mismatches, mismatches
from harness.errors import ErrorKind, ServerError
from harness.gate.divergence import DivergenceLooks, DivergenceStop
from harness.gate.sequential import EarlyStop, Looks
from harness.records import CellError, CellOutcome, QuestionRecord, ServerInfo, Timings

LOG_LIMIT_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class CellJob:
    spec: LaunchSpec
    settings: EvalSettings
    queued_at: float  # driver's wall clock when the cell was submitted
    stall_timeout_s: float = 300.0
    early_stop: EarlyStop | None = None
    divergence_stop: DivergenceStop | None = None  # when the reference came back before the cell started


def read_log(path: Path) -> str:
    """The server's log, its last LOG_LIMIT_BYTES when longer."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - LOG_LIMIT_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return text if size <= LOG_LIMIT_BYTES else "[... log truncated ...]\n" + text


class _EarlyStopWatch:
    """The hang watch's heartbeat and the early-stop bookkeeping for one evaluation."""

    def __init__(self, early_stop: EarlyStop | None, divergence_stop: DivergenceStop | None = None) -> None:
        self.looks: list[Looks | DivergenceLooks] = [Looks(early_stop)] if early_stop else []
        if divergence_stop is not None:
            self.looks.append(DivergenceLooks(divergence_stop))
        self.seen = 0
        # When the server last answered any request (a question, a teacher text, a self-check): what
        # the hang watch measures quiet from.
        self.last_answer = time.monotonic()
        self.stop_reason: str | None = None

    def on_answer(self) -> None:
        self.last_answer = time.monotonic()

    def should_stop(self, records: list[QuestionRecord]) -> bool:
        if not self.looks:
            return False
        new, self.seen = records[self.seen:], len(records)  # the evaluator appends: only these are new
        for record in new:
            for looks in self.looks:
                reason = looks.add(record)
                if reason:
                    self.stop_reason = reason
                    return True
        return False


async def _measure(server: ServerProcess, job: CellJob, plan: ProtocolPlan, info: ServerInfo,
                   timings: dict[str, float]) -> CellOutcome:
    """With the server up: read what it resolved, check it, and run GSM8K unless it mismatches."""
    cell = job.spec.cell
    raw_info = await server.server_info()
    version = raw_info.get("version")
    info = info.model_copy(update={"version": None if version is None else str(version), "port": server.port,
                                   "resolved": raw_info})
    unverified = None
    if job.spec.engine.info_routes:
        problems = mismatches(cell.expected, raw_info, server.argv)
        if problems:
            return CellOutcome(cell_id=cell.cell_id, args=server.argv, server=info, mismatches=problems)
    elif cell.expected:
        unverified = (f"resolved configuration not reported (engine {job.spec.engine.name} has no configuration "
                      f"route): {', '.join(sorted(cell.expected))} not checked")
    watch = _EarlyStopWatch(job.early_stop, job.divergence_stop)
    score, records = await server.guard(
        evaluate(server.base_url, plan, job.settings, should_stop=watch.should_stop, on_answer=watch.on_answer),
        progress=lambda: watch.last_answer, stall_timeout_s=job.stall_timeout_s)
    timings["eval_s"] = score.eval_s
    unexercised = exercise_mismatches(cell.expected, records)
    return CellOutcome(cell_id=cell.cell_id, args=server.argv, server=info, score=score, questions=records,
                       stopped_early=watch.stop_reason, mismatches=unexercised, unverified=unverified)


async def run_cell(job: CellJob, plan: ProtocolPlan, log_dir: Path, node: str) -> tuple[CellOutcome, str]:
    """Launch the cell's server on `node`, check its resolved config, run GSM8K, stop it. Never
    raises for infrastructure failures: they come back as an outcome with `error` set."""
    started = time.time()
    cell = job.spec.cell
    log_path = log_dir / f"{cell.cell_id}.log"
    # The server is told which Ray node it runs on (the simulator keeps its page cache per node).
    spec = replace(job.spec, env={**job.spec.env, "REGRESS_NODE_ID": node})
    server = ServerProcess(spec, log_path)
    devices = {**os.environ, **spec.environment()}.get("CUDA_VISIBLE_DEVICES")  # what the server sees
    info = ServerInfo(cuda_visible_devices=devices, node=node)
    timings: dict[str, float] = {"queued_s": max(0.0, started - job.queued_at), "started_at": started}
    try:
        async with server:
            timings["startup_s"] = server.startup_s
            outcome = await _measure(server, job, plan, info, timings)
    except ServerError as error:
        outcome = CellOutcome(cell_id=cell.cell_id, args=server.argv, server=info, log_tail=error.log_tail,
                              error=CellError(kind=error.kind, message=str(error)))
    if server.leftover_pids and outcome.error is None:
        outcome = outcome.model_copy(update={"error": CellError(
            kind=ErrorKind.LEFTOVER_PROCESSES, message=f"server processes survived the stop: {server.leftover_pids}")})
    timings["ended_at"] = time.time()
    timings["total_s"] = timings["ended_at"] - started + timings["queued_s"]
    outcome = outcome.model_copy(update={"timings": Timings(**timings)})
    return outcome, read_log(log_path)
