"""`regress eval`: score one already-running server (sglang, vLLM or any OpenAI-compatible one) and
write the same results layout as a matrix run, with a single cell, so `compare` works on it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness import __version__
from harness.engine.server import read_server_info
from harness.errors import ConfigError, ServerError
from harness.gate.verdict import judge
from harness.gsm8k.dataset import Gsm8k
from harness.gsm8k.evaluator import EvalSettings, evaluate
from harness.gsm8k.evaluator import Progress as EvalProgress
from harness.gsm8k.protocol import ProtocolPlan
from harness.results.assemble import cell_result, close_run, sink_cell
from harness.results.records import CellOutcome, RunInfo, ServerInfo, Timings, run_exit_code
from harness.results.reporting import print_summary
from harness.results.store import ResultsStore, new_run_id
from harness.results.tracking import Tracker
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
    if not request.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url: {request.base_url!r} must start with http:// or https://")
    outcome = asyncio.run(_measure(request, plan, settings, console))
    verdict = judge(outcome, request.floor, gate, cells_tested=1)
    run_id = new_run_id(request.name)
    store = ResultsStore(request.results_dir, run_id)
    info = RunInfo(run_id=run_id, suite=request.name, config_path=request.base_url, config_sha256="",
                   engine="external", harness_version=__version__, protocol=plan.name,
                   protocol_fingerprint=plan.fingerprint, dataset_sha256=data.sha256,
                   started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    store.write_run(info)
    tracker = Tracker(request.tracking_uri) if request.tracking_uri else None
    if tracker is not None:
        info = info.model_copy(update={"mlflow_run_id": tracker.start(info, {"base_url": request.base_url}),
                                       "tracking_uri": request.tracking_uri})
    model = str(outcome.server.resolved.get("model_path") or settings.model_name or "server")
    result = cell_result(cell_id=request.name, model=model, factors={}, reference_cell=None, floor=request.floor,
                         outcome=outcome, verdict=verdict, fingerprint=plan.fingerprint, log_path=None)
    result = sink_cell(store, tracker, result, outcome, "")
    exit_code = run_exit_code([result.status])
    info = close_run(store, info, [result], tracker, exit_code)
    print_summary(console, info, [result], str(store.path))
    return exit_code
