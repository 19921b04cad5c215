"""The evaluator against simulated servers: retries, honest failures, invalid answers."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from harness.benchmark.evaluator import EvalSettings, evaluate
from harness.benchmark.gsm8k.protocol import build_plan
from harness.engine.server import ServerProcess
from harness.gate.verdict import Stage, judge
from harness.records import CellOutcome, Status
from harness.suite.config import GateSpec
from tests.helpers import fault_world, make_cell, sim_spec

CELL = make_cell({"attention_backend": "triton"})
FAST_RETRIES = EvalSettings(concurrency=16, max_attempts=6, backoff_initial_s=0.01, backoff_max_s=0.05)


def evaluate_against(tmp_path, world, plan, settings=FAST_RETRIES):
    async def scenario():
        async with ServerProcess(sim_spec(CELL, world), tmp_path / "s.log") as server:
            return await evaluate(server.base_url, plan, settings)

    return asyncio.run(scenario())


def test_a_burst_of_503s_is_retried_and_survived(tmp_path, gsm8k):
    world = fault_world(tmp_path, error_status=503, error_rate=0.3, error_until_request=150)
    score, records = evaluate_against(tmp_path, world, build_plan(gsm8k, "clean", 100, 0))
    assert score.n == 100 and score.infra_failures == 0
    assert score.retries > 5 and max(r.attempts for r in records) > 1
    assert score.accuracy > 0.8


def test_a_burst_of_429s_is_retried_too(tmp_path, gsm8k):
    world = fault_world(tmp_path, error_status=429, error_rate=0.5, error_until_request=100)
    score, _ = evaluate_against(tmp_path, world, build_plan(gsm8k, "clean", 60, 0))
    assert score.n == 60 and score.retries > 0


def test_a_server_that_keeps_failing_makes_the_cell_error_not_fail(tmp_path, gsm8k):
    world = fault_world(tmp_path, error_status=503, error_rate=1.0)
    settings = replace(FAST_RETRIES, max_attempts=3)
    score, records = evaluate_against(tmp_path, world, build_plan(gsm8k, "clean", 30, 0), settings)
    assert score.n == 0 and score.infra_failures == 30
    assert all(r.error and "HTTP 503" in r.error and r.attempts == 3 for r in records)
    verdict = judge(CellOutcome(cell_id="c", args=[], score=score, questions=records), 0.85, GateSpec(), Stage(0.01))
    assert verdict.status is Status.ERROR


def test_malformed_200_responses_are_transport_failures_not_wrong_answers(tmp_path, gsm8k):
    world = fault_world(tmp_path, malformed_rate=1.0)
    score, records = evaluate_against(tmp_path, world, build_plan(gsm8k, "clean", 20, 0),
                                      replace(FAST_RETRIES, max_attempts=2))
    assert score.infra_failures == 20 and all("malformed" in r.error for r in records)


def test_empty_answers_are_the_models_answer(tmp_path, gsm8k):
    world = fault_world(tmp_path, empty_output_rate=1.0)
    score, records = evaluate_against(tmp_path, world, build_plan(gsm8k, "clean", 20, 0))
    assert score.infra_failures == 0 and score.invalid_rate == 1.0 and score.accuracy == 0.0
    assert all(r.error is None and r.pred is None for r in records)


def test_other_4xx_is_not_retried_and_says_what_the_server_answered(tmp_path, gsm8k):
    plan = build_plan(gsm8k, "clean", 5, 0)
    broken = replace(plan, prompts=tuple(replace(p, text=None) for p in plan.prompts))
    score, records = evaluate_against(tmp_path, None, broken)
    assert score.infra_failures == 5
    assert all(r.attempts == 1 and r.error.startswith("HTTP 400") and "prompt" in r.error for r in records)


def test_records_keep_plan_order_and_token_counts(tmp_path, gsm8k):
    plan = build_plan(gsm8k, "clean", 40, 0)
    score, records = evaluate_against(tmp_path, None, plan)
    assert [r.index for r in records] == [p.index for p in plan.prompts]
    assert all(r.output_tokens > 0 and r.finish_reason == "stop" for r in records)
    assert score.throughput.requests_per_s > 0 and 0 < score.accuracy <= 1


def test_the_openai_client_path_scores_the_same(tmp_path, gsm8k):
    plan = build_plan(gsm8k, "chat", 30, 0)
    _, by_aiohttp = evaluate_against(tmp_path, None, plan)
    score, by_openai = evaluate_against(tmp_path, None, plan, replace(FAST_RETRIES, client="openai"))
    assert [r.correct for r in by_openai] == [r.correct for r in by_aiohttp] and score.n == 30


def test_the_openai_client_path_retries_and_reports(tmp_path, gsm8k):
    world = fault_world(tmp_path, error_status=503, error_rate=1.0)
    score, records = evaluate_against(tmp_path, world, build_plan(gsm8k, "clean", 5, 0),
                                      replace(FAST_RETRIES, client="openai", max_attempts=2))
    assert score.infra_failures == 5 and all(r.attempts == 2 and "HTTP 503" in r.error for r in records)


def test_latency_is_the_answering_attempts_not_the_retries_and_their_backoff(gsm8k):
    """Seen against a real server: latency_s summed every retry and its backoff."""
    from harness.benchmark.evaluator import _Answer, _ask, _Retryable

    calls = []

    async def flaky(route, body, endpoint):
        calls.append(route)
        if len(calls) < 3:
            raise _Retryable("HTTP 503")
        return _Answer("#### 5", "stop", 3)

    plan = build_plan(gsm8k, "clean", 1, 0)
    settings = EvalSettings(backoff_initial_s=0.2, backoff_max_s=0.2)
    record = asyncio.run(_ask(flaky, plan, plan.prompts[0], settings))
    assert record.attempts == 3 and record.error is None
    assert record.latency_s < 0.2  # two backoffs of 0.2 s happened; the answer itself took no time


def hostile_server(routes):
    """An aiohttp server on loopback with these (method, path, handler) routes; returns (runner, url)."""
    from aiohttp import web

    async def start():
        app = web.Application()
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    return start


def test_a_redirect_to_another_server_is_never_followed(gsm8k):
    """Following it would score the other server's answers under this one's name."""
    from aiohttp import web

    plan = build_plan(gsm8k, "clean", 3, 0)
    reached = []

    async def other(request):
        reached.append(request.path)
        return web.json_response({"choices": [{"text": "#### 1", "finish_reason": "stop"}], "usage": {}})

    async def scenario():
        other_runner, other_url = await hostile_server([("POST", "/v1/completions", other)])()

        async def redirect(request):
            raise web.HTTPTemporaryRedirect(other_url + "/v1/completions")

        runner, url = await hostile_server([("POST", "/v1/completions", redirect)])()
        try:
            return await evaluate(url, plan, FAST_RETRIES)
        finally:
            await runner.cleanup()
            await other_runner.cleanup()

    score, records = asyncio.run(scenario())
    assert score.n == 0 and reached == []
    assert all("HTTP 307" in r.error and "redirects are not followed" in r.error and r.attempts == 1 for r in records)


def test_a_body_past_the_limit_is_not_read_whole(gsm8k, monkeypatch):
    """A 1 GiB answer (or a gzip bomb) was read whole: now the read stops at the limit, once, unretried."""
    from aiohttp import web

    import harness.benchmark.evaluator as evaluator_module

    monkeypatch.setattr(evaluator_module, "ANSWER_LIMIT_BYTES", 1 << 20)  # 1 MiB here; 16 MiB in use
    plan = build_plan(gsm8k, "clean", 2, 0)
    sent = []

    async def endless(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(64):  # 4 MiB, in chunks, no Content-Length
            await response.write(b" " * 65536)
            sent.append(1)
        return response

    async def scenario():
        runner, url = await hostile_server([("POST", "/v1/completions", endless)])()
        try:
            return await evaluate(url, plan, FAST_RETRIES)
        finally:
            await runner.cleanup()

    score, records = asyncio.run(scenario())
    assert score.n == 0 and all("over the 1 MiB limit" in r.error and r.attempts == 1 for r in records)


def test_a_server_that_trickles_bytes_is_cut_off_at_the_questions_deadline(gsm8k):
    """One byte every 0.2 s never trips the request timeout's read, and with 6 attempts of 600 s it
    held a question for an hour: all attempts together now stop at question_deadline_s."""
    import dataclasses
    import time

    from aiohttp import web

    plan = build_plan(gsm8k, "clean", 2, 0)

    async def trickle(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(1000):
            await response.write(b" ")
            await asyncio.sleep(0.2)
        return response

    async def scenario():
        runner, url = await hostile_server([("POST", "/v1/completions", trickle)])()
        try:
            return await evaluate(url, plan, dataclasses.replace(FAST_RETRIES, request_timeout_s=60.0,
                                                                 question_deadline_s=1.5))
        finally:
            await runner.cleanup()

    started = time.perf_counter()
    score, records = asyncio.run(scenario())
    assert time.perf_counter() - started < 30  # not 60 s x attempts
    assert score.n == 0 and all("deadline of 1.5 s" in r.error for r in records)


def test_every_answer_is_a_heartbeat_the_self_checks_after_the_last_question_too(tmp_path, gsm8k):
    """The hang watch measures quiet from the server's last answer to any request. The self-checks
    ask after the last question was graded (on a slow CPU, for minutes): each of their answers
    beats too, so a server busy with them is not judged hung for want of question answers."""
    graded, heard = [], []
    settings = replace(FAST_RETRIES, self_checks=4, flush_route="/flush_cache")

    async def scenario():
        async with ServerProcess(sim_spec(CELL, fault_world(tmp_path)), tmp_path / "s.log") as server:
            return await evaluate(server.base_url, build_plan(gsm8k, "clean", 20, 0), settings,
                                  on_progress=lambda _: graded.append(time.monotonic()),
                                  on_answer=lambda: heard.append(time.monotonic()))

    _, records = asyncio.run(scenario())
    checked = [r.checks for r in records if r.checks is not None]
    assert len(checked) == 4 and all(c.replay and c.replay.error is None for c in checked)
    assert len(graded) == 20
    after_last_question = [moment for moment in heard if moment > graded[-1]]
    # each checked question: its teacher text alone, its replay, the decode check's 3 requests, its cold text
    assert len(after_last_question) >= 4 * 6, len(after_last_question)
    assert len(heard) >= 2 * 20 + 4 * 6  # every question's answer and teacher text beat as well
