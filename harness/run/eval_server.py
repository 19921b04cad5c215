"""`regress eval`: score one already-running server (sglang, vLLM or any OpenAI-compatible one) and
write the same results layout as a matrix run, with a single cell, so `compare` works on it.

Before anything is written, the server must answer at all (a URL nobody listens on is one line and
exit 3, not 360 failed connections and an MLflow run). The run is stamped when it starts; the model
name found on `/v1/models` is the one recorded. With no floor there is no test to pass: the verdict
is `inconclusive` ("no test made"), never `pass`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.benchmark.base import Dataset, ProtocolPlan
from harness.benchmark.evaluator import EvalSettings, evaluate
from harness.benchmark.evaluator import Progress as EvalProgress
from harness.benchmark.http import INFO_LIMIT_BYTES, BodyTooLarge, bounded_body, bounded_json
from harness.engine.server_info import read_server_info
from harness.errors import ConfigError, InfraError, ServerError
from harness.gate.budget import Budget
from harness.gate.verdict import Stage, judge
from harness.records import CellOutcome, RunInfo, ServerInfo, Status, Timings, Verdict, run_exit_code
from harness.results.provenance import closed_run_info, new_run_info
from harness.results.sinks import FinishedCell, Sinks, standard_sinks
from harness.results.store import ResultsStore, new_run_id
from harness.results.tracker_process import TrackerProcess
from harness.run.gating import cell_result
from harness.suite.config import GateSpec

REACHABLE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EvalRequest:
    base_url: str
    name: str
    floor: float
    results_dir: Path
    tracking_uri: str | None
    model_name: str | None = None
    models_timeout_s: float = 120.0  # /v1/models may wait behind a busy queue


async def reachable(base_url: str) -> None:
    """Raise InfraError unless something answers HTTP at `base_url` (any status will do)."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REACHABLE_TIMEOUT_S)) as session, \
                session.get(base_url + "/v1/models", allow_redirects=False) as response:
            await bounded_body(response, INFO_LIMIT_BYTES)
    except BodyTooLarge:
        return  # it answers: what it said is for the evaluation to judge
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        raise InfraError(f"nothing answers at {base_url} ({type(error).__name__}: {error}); start the server "
                         "first, or check --base-url") from None


async def served_model(base_url: str, timeout_s: float, console: Console) -> str | None:
    """The first model id `/v1/models` lists, which OpenAI-compatible servers require in requests."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session, \
                session.get(base_url + "/v1/models", allow_redirects=False) as response:
            if response.status != 200:
                return None
            data = (await bounded_json(response, INFO_LIMIT_BYTES)).get("data") or []
            return str(data[0]["id"]) if data else None
    except asyncio.TimeoutError:
        console.print(f"[yellow]/v1/models did not answer within {timeout_s:.0f} s[/]: requests name the model "
                      "'default' (pass --model to name it)")
        return None
    except (aiohttp.ClientError, ValueError, KeyError, AttributeError, BodyTooLarge):
        return None


async def _progress_bar(request: EvalRequest, base_url: str, plan: ProtocolPlan, settings: EvalSettings,
                        console: Console):
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
        return await evaluate(base_url, plan, settings, on_progress=update)


async def _measure(request: EvalRequest, plan: ProtocolPlan, settings: EvalSettings,
                   console: Console) -> tuple[CellOutcome, str]:
    """The server's answers, and the model name the requests used."""
    base_url = request.base_url.rstrip("/")
    try:
        info = await read_server_info(base_url) or {}
    except ServerError:
        info = {}
    model = (request.model_name or await served_model(base_url, request.models_timeout_s, console)
             or str(info.get("model_path") or "default"))
    score, records = await _progress_bar(request, base_url, plan, replace(settings, model_name=model), console)
    version = info.get("version")
    outcome = CellOutcome(cell_id=request.name, args=[], score=score, questions=records,
                          server=ServerInfo(version=None if version is None else str(version), resolved=info),
                          timings=Timings(eval_s=score.eval_s, total_s=score.eval_s))
    return outcome, model


def _not_found_hint(outcome: CellOutcome, plan: ProtocolPlan) -> str:
    """Every question answered 404: name the likely cause."""
    errors = [r.error or "" for r in outcome.questions]
    if not errors or not all(e.startswith("HTTP 404") for e in errors):
        return ""
    if plan.endpoint == "generate":
        return ("; every request got 404 on /generate: protocol sglang-fewshot needs an sglang server "
                "(its native /generate); use --protocol clean for other OpenAI-compatible servers")
    return f"; every request got 404: does the server serve the OpenAI {plan.endpoint} route?"


def _verdict(outcome: CellOutcome, plan: ProtocolPlan, floor: float, gate: GateSpec) -> Verdict:
    # One server, no extension: the whole budget, less early stop's share (eval has none), on its floor.
    verdict = judge(outcome, floor, gate, Stage(alpha=Budget(gate.alpha, 1, early_stop_share=0.0).stage(1)))
    if verdict.status is Status.ERROR:
        return verdict.model_copy(update={"reason": verdict.reason + _not_found_hint(outcome, plan)})
    if floor <= 0 and verdict.status is Status.PASS:
        # No reference and no floor: nothing was tested, so nothing can pass (a server answering 0/60 would).
        return verdict.model_copy(update={"status": Status.INCONCLUSIVE, "reason": verdict.reason
                                          + "; no test made: give --floor (the accuracy this server must reach)"})
    return verdict


def run_eval(request: EvalRequest, data: Dataset, plan: ProtocolPlan, settings: EvalSettings, gate: GateSpec,
             console: Console) -> int:
    """Score the server, judge it alone (its floor; no reference), and write every sink."""
    if not request.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url: {request.base_url!r} must start with http:// or https://")
    run_id = new_run_id(request.name)
    info = new_run_info(run_id=run_id, suite=request.name, config_path=request.base_url, config_sha256="",
                        trigger="manual", engine="external", plan=plan, extraction=gate.extraction)
    asyncio.run(reachable(request.base_url.rstrip("/")))  # before anything is written or opened
    tracker = TrackerProcess(request.tracking_uri) if request.tracking_uri else None
    sinks = standard_sinks(ResultsStore(request.results_dir, info.run_id), tracker, console)
    # MLflow's import and the store's opening overlap the questions, in a process of their own (a
    # thread here would share the event loop's GIL: the server's utilisation fell from 0.95 to 0.86).
    sinks.prepare(info)
    outcome, model = asyncio.run(_measure(request, plan, settings, console))
    return _write(request, sinks, info, outcome, model, _verdict(outcome, plan, request.floor, gate))


def _write(request: EvalRequest, sinks: Sinks, info: RunInfo, outcome: CellOutcome, model: str,
           verdict: Verdict) -> int:
    info = sinks.open(info, {"base_url": request.base_url, "model": model})
    result = sinks.cell(FinishedCell(
        cell_result(outcome, verdict, cell_id=request.name, model=model, factors={}, reference_cell=None,
                    floor=request.floor, fingerprint=info.protocol_fingerprint or ""),
        outcome.questions, outcome.server.resolved))
    exit_code = run_exit_code([result.status])
    sinks.close(closed_run_info(info, [result], exit_code), [result])
    return exit_code
