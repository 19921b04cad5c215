"""`regress eval`: score one already-running server (sglang, vLLM or any OpenAI-compatible one) and
write the same results layout as a matrix run, with a single cell, so `compare` works on it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.engine.server import read_server_info
from harness.errors import ConfigError, ServerError
from harness.gate.verdict import judge
from harness.gsm8k.dataset import Gsm8k
from harness.gsm8k.evaluator import EvalSettings, evaluate
from harness.gsm8k.evaluator import Progress as EvalProgress
from harness.gsm8k.protocol import ProtocolPlan
from harness.results.provenance import closed_run_info, new_run_info
from harness.results.records import CellOutcome, ServerInfo, Timings, run_exit_code
from harness.results.sinks import FinishedCell, standard_sinks
from harness.results.store import ResultsStore, new_run_id
from harness.run.gating import cell_result
from harness.suite.config import GateSpec


@dataclass(frozen=True)
class EvalRequest:
    base_url: str
    name: str
    floor: float
    results_dir: Path
    tracking_uri: str | None
    model_name: str | None = None


async def served_model(base_url: str) -> str | None:
    """The first model id `/v1/models` lists, which OpenAI-compatible servers require in requests."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session, \
                session.get(base_url + "/v1/models") as response:
            if response.status != 200:
                return None
            data = (await response.json(content_type=None)).get("data") or []
            return str(data[0]["id"]) if data else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, AttributeError):
        return None


async def _measure(request: EvalRequest, plan: ProtocolPlan, settings: EvalSettings,
                   console: Console) -> CellOutcome:
    base_url = request.base_url.rstrip("/")
    try:
        info = await read_server_info(base_url) or {}
    except ServerError:
        info = {}
    model = request.model_name or await served_model(base_url) or str(info.get("model_path") or "default")
    settings = EvalSettings(**{**settings.__dict__, "model_name": model})
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[live]}"), TimeElapsedColumn(), console=console)
    task = progress.add_task(request.name, total=len(plan.prompts), live="")

    def update(state: EvalProgress) -> None:
        answered = state.done - state.failures
        accuracy = state.correct / answered if answered else 0.0
        rate = state.done / state.elapsed_s if state.elapsed_s else 0.0
        progress.update(task, completed=state.done,
                        live=f"accuracy {accuracy:.3f} · {rate:.0f} req/s · {state.failures} failed")

    with progress:
        score, records = await evaluate(base_url, plan, settings, on_progress=update)
    version = info.get("version")
    return CellOutcome(cell_id=request.name, args=[], score=score, questions=records,
                       server=ServerInfo(version=None if version is None else str(version), resolved=info),
                       timings=Timings(eval_s=score.eval_s, total_s=score.eval_s))


def run_eval(request: EvalRequest, data: Gsm8k, plan: ProtocolPlan, settings: EvalSettings, gate: GateSpec,
             console: Console) -> int:
    """Score the server, judge it alone (its floor; no reference), and write every sink."""
    if not request.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url: {request.base_url!r} must start with http:// or https://")
    outcome = asyncio.run(_measure(request, plan, settings, console))
    verdict = judge(outcome, request.floor, gate, cells_tested=1)
    run_id = new_run_id(request.name)
    store = ResultsStore(request.results_dir, run_id)
    info = new_run_info(run_id=run_id, suite=request.name, config_path=request.base_url, config_sha256="",
                        trigger="manual", engine="external", plan=plan, extraction=gate.extraction)
    sinks = standard_sinks(store, request.tracking_uri, console)
    info = sinks.open(info, {"base_url": request.base_url})
    model = str(outcome.server.resolved.get("model_path") or settings.model_name or "server")
    result = sinks.cell(FinishedCell(
        cell_result(outcome, verdict, cell_id=request.name, model=model, factors={}, reference_cell=None,
                    floor=request.floor, fingerprint=plan.fingerprint),
        outcome.questions, outcome.server.resolved))
    exit_code = run_exit_code([result.status])
    sinks.close(closed_run_info(info, [result], exit_code), [result])
    return exit_code
