"""The simulator's HTTP server: sglang's routes over a world's decisions (aiohttp)."""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from harness.benchmark.gsm8k.dataset import Problem, load_gsm8k, read_split
from harness.benchmark.gsm8k.protocol import clean_solution
from harness.sim.world import Decision, Fault, World, unit_hash

_QUESTION_MARK = "Question:"
_EXAMPLE_END = re.compile(r"(?<=\n\n)(?=Question:)")  # between the examples of a few-shot prefix


class AnswerBook:
    """The GSM8K problems the simulator knows, by question text. From a local folder the test split
    is read at start and the train split (5.7 x larger) at the first question the test split lacks:
    most servers are asked test questions only, and a simulated start is paid ~250 times a test run.
    From the hub (`source` None) both splits load at once, as `load_gsm8k` gives them."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        if source is None:
            data = load_gsm8k(None)
            self.problems, self.train_read = _by_question((*data.train, *data.test)), True  # test wins a tie, as below
        else:
            self.problems, self.train_read = _by_question(read_split(source, "test")), False

    def get(self, question: str) -> Problem | None:
        problem = self.problems.get(question)
        if problem is None and not self.train_read:
            self.train_read = True
            self.problems = {**_by_question(read_split(self.source, "train")), **self.problems}
            problem = self.problems.get(question)
        return problem


def _by_question(problems: Iterable[Problem]) -> dict[str, Problem]:
    return {problem.question.strip(): problem for problem in problems}


@dataclass
class SimState:
    world: World
    resolved: dict[str, Any]
    answers: AnswerBook
    faults: list[Fault]
    prefixes: set[str] = field(default_factory=set)
    prompts: set[str] = field(default_factory=set)  # whole prompts seen since the last flush (bugs warm)
    decoded: set[str] = field(default_factory=set)  # texts whose tail a decode wrote, since the last flush (radix on)
    vocabulary: dict[str, int] = field(default_factory=dict)  # the simulator's token ids: one per 4-character piece
    pieces: list[str] = field(default_factory=list)  # and back
    in_flight: int = 0  # requests accepted and not yet answered (a `batched` bug strikes when others are)
    requests: int = 0
    first_request_at: float | None = None
    request_times: list[float] = field(default_factory=list)  # when each request arrived (benchmarks' windows)
    last_served_at: float | None = None  # when a slot was last given back
    busy_slot_s: float = 0.0  # slot-seconds spent serving: utilisation = busy / (slots x wall time)
    serving: dict[int, float] = field(default_factory=dict)  # request number -> when it got its slot
    slots: asyncio.Semaphore | None = None

    @property
    def model_path(self) -> str:
        return self.resolved["model_path"]


def split_prompt(text: str) -> tuple[str, str]:
    """(shared prefix, question) of a few-shot completion prompt."""
    start = text.rfind(_QUESTION_MARK)
    if start < 0:
        return "", text.strip()
    question = text[start + len(_QUESTION_MARK):]
    question = question.rsplit("\nAnswer:", 1)[0]
    return text[:start], question.strip()


_BOXED_REQUEST = "\\boxed{}."  # what sgl-eval's zero-shot prompt asks, before a blank line and the problem


def split_messages(messages: list[dict[str, Any]]) -> tuple[str, str]:
    last = str(messages[-1].get("content", "")) if messages else ""
    if _BOXED_REQUEST in last:
        last = last.split(_BOXED_REQUEST, 1)[1]
    question = last.strip().removeprefix(_QUESTION_MARK).strip()
    return json.dumps(messages[:-1], sort_keys=True), question


def asks_for_boxed(messages: list[dict[str, Any]]) -> bool:
    return bool(messages) and _BOXED_REQUEST in str(messages[-1].get("content", ""))


def compose(state: SimState, decision: Decision, question: str, max_tokens: int, chat: bool,
            boxed: bool = False) -> tuple[str, str]:
    """The answer text for a decision, and its finish reason (the final number in `\\boxed{}` when
    the prompt asked for it)."""
    problem = state.answers.get(question)
    if decision.kind == "empty":
        return "", "stop"
    if decision.kind == "garbage":
        return ("the the 0 ," * max_tokens)[: max_tokens * 4], "length"
    if problem is None or decision.kind == "invalid":
        return " I am not able to work out this problem.", "stop"
    body, _, final = clean_solution(problem.solution).rpartition("####")
    answer = final.strip()
    if decision.kind == "wrong":
        offset = 1 + int(unit_hash(state.world.seed, question, "offset") * 20)
        answer = str(int(float(answer.replace(",", ""))) + offset)
    final = f"\\boxed{{{answer}}}" if boxed else answer
    text = " " + body.strip() + (f"\nThe answer is {final}." if chat else f"\n#### {final}")
    if len(text) // 4 + 1 > max_tokens:
        return text[: max_tokens * 4], "length"
    return text, "stop"


def apply_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


async def _faults_before_answer(state: SimState, number: int) -> web.Response | None:
    for fault in state.faults:
        if fault.crash_after_requests is not None and number > fault.crash_after_requests:
            print(f"[sim] fault {fault.name}: simulated crash after {fault.crash_after_requests} requests",
                  file=sys.stderr, flush=True)
            os._exit(139)
        if fault.kill_parent_after_requests is not None and number > fault.kill_parent_after_requests:
            once = Path(fault.once_file) if fault.once_file else None
            if once is None or not once.exists():
                if once is not None:
                    once.write_text(str(os.getppid()))
                print(f"[sim] fault {fault.name}: killing parent {os.getppid()}", file=sys.stderr, flush=True)
                os.kill(os.getppid(), 9)
        hang = fault.hang_after_requests is not None and number > fault.hang_after_requests
        if hang or unit_hash(state.world.seed, "hang", number) < fault.hang_request_rate:
            await asyncio.Event().wait()
        in_burst = fault.error_until_request is None or number <= fault.error_until_request
        if in_burst and unit_hash(state.world.seed, "error", number) < fault.error_rate:
            return web.Response(status=fault.error_status, text="simulated overload")
        if unit_hash(state.world.seed, "malformed", number) < fault.malformed_rate:
            return web.Response(status=200, text='{"choices": [', content_type="application/json")
    return None


def _cached_chars(state: SimState, prefix: str) -> int:
    """How much of this few-shot prefix the radix cache holds already, in characters, and (radix
    on) remember all of it now. The simulated cache works in whole examples: it holds every chain
    of examples it has seen from a prompt's start, and a prompt hits the longest chain it begins
    with, so prompts that share their first k shots share a cached prefix (the mixed-prefix protocol)."""
    if not prefix or state.resolved["disable_radix_cache"]:
        return 0
    cached = length = 0
    chain = hashlib.sha1()
    for example in _EXAMPLE_END.split(prefix):
        if not example:
            continue
        chain.update(example.encode())
        length += len(example)
        key = chain.hexdigest()
        if key in state.prefixes and cached == length - len(example):
            cached = length
        state.prefixes.add(key)
    return cached


def _seen(state: SimState, prompt: str) -> bool:
    """Whether the server has seen this whole prompt since its cache was last flushed (radix on), and
    remember it now."""
    if state.resolved["disable_radix_cache"]:
        return False
    key = hashlib.sha1(prompt.encode()).hexdigest()
    seen = key in state.prompts
    state.prompts.add(key)
    return seen


async def _serve(state: SimState, number: int, prefill_tokens: int, completion_tokens: int) -> None:
    """Hold one of the server's slots for the simulated service time of one request."""
    latency = state.world.latency
    assert state.slots is not None
    async with state.slots:
        acquired = state.serving[number] = time.perf_counter()
        model = state.world.model(state.model_path)
        base_s = model.base_s if model.base_s is not None else latency.base_s
        delay = base_s + prefill_tokens * latency.prefill_s_per_token + completion_tokens * latency.decode_s_per_token
        if delay > 0:
            await asyncio.sleep(delay)
        state.busy_slot_s += time.perf_counter() - acquired
        state.last_served_at = time.time()
        del state.serving[number]


async def _answer(state: SimState, prefix: str, question: str, stop: list[str], max_tokens: int,
                  chat: bool, number: int = 0, boxed: bool = False) -> tuple[str, str, int, int, int]:
    """(text, finish_reason, prompt_tokens, completion_tokens, cached prompt tokens) after the
    simulated service time."""
    cached_chars = _cached_chars(state, prefix)
    prefix_hit = cached_chars > 0
    batched = state.in_flight > 1  # others are in flight as it is served
    warm = _seen(state, prefix + question)
    empty = any(unit_hash(state.world.seed, "empty", question) < f.empty_output_rate for f in state.faults)
    decision = Decision("empty") if empty else state.world.decide(state.model_path, question, state.resolved,
                                                                    prefix_hit, os.environ.get("REGRESS_SIM_COMMIT"),
                                                                    warm, batched)
    text, reason = compose(state, decision, question, max_tokens, chat, boxed)
    text, stopped = apply_stop(text, stop)
    reason = "stop" if stopped else reason
    prompt_tokens = (len(prefix) + len(question)) // 4 + 1
    completion_tokens = len(text) // 4 + (1 if text else 0)
    cached = cached_chars // 4
    await _serve(state, number, prompt_tokens - cached, completion_tokens)
    return text, reason, prompt_tokens, completion_tokens, cached


async def _teacher_forced(state: SimState, text: str, start: int, number: int) -> dict[str, Any]:
    """sglang's `/generate` meta_info for a prompt scored without decoding (`max_new_tokens` 0,
    `return_logprob`, `top_logprobs_num` 1): entries from `logprob_start_len` on, the first without
    a log-probability, as sglang returns them. The continuation is what follows the last "Answer:"."""
    prefix, question = split_prompt(text)
    continuation = text.rpartition("\nAnswer:")[2]
    cached_chars = _cached_chars(state, prefix)
    _seen(state, prefix + question)  # the request's prompt holds the question's whole prompt
    scores = state.world.teacher_forced(state.model_path, question, continuation, state.resolved, cached_chars > 0,
                                        os.environ.get("REGRESS_SIM_COMMIT"), batched=state.in_flight > 1)
    cached = cached_chars // 4
    prompt_tokens = start + 1 + len(scores.token_ids)
    await _serve(state, number, prompt_tokens - cached, 0)
    entries = [[None, 0, None], *([lp, token, None] for lp, token in zip(scores.logprobs, scores.token_ids, strict=True))]
    tops = [None, *([[lp if top == token else min(0.0, lp + 0.1), top, None]]
                    for lp, token, top in zip(scores.logprobs, scores.token_ids, scores.top_ids, strict=True))]
    return {"id": str(number), "prompt_tokens": prompt_tokens, "completion_tokens": 0, "cached_tokens": cached,
            "finish_reason": {"type": "length"}, "input_token_logprobs": entries, "input_top_logprobs": tops,
            "output_token_logprobs": [], "output_top_logprobs": []}


def _token_ids(state: SimState, pieces: list[str]) -> list[int]:
    for piece in pieces:
        if piece not in state.vocabulary:
            state.vocabulary[piece] = len(state.pieces)
            state.pieces.append(piece)
    return [state.vocabulary[piece] for piece in pieces]


def _pieces(text: str) -> list[str]:
    return [text[i:i + 4] for i in range(0, len(text), 4)]


async def _decoded(state: SimState, body: dict[str, Any], number: int) -> web.Response:
    """sglang's `/generate` with token ids or log-probabilities, as the decode self-check asks it
    (harness.benchmark.decode_check): the input as `text` or `input_ids` (the simulator's ids: one
    per 4-character piece, as it counts tokens), `max_new_tokens` greedy tokens (`ignore_eos`: padded
    to their number), the output's log-probabilities, and the input's from `logprob_start_len` on
    (0: nothing read from the cache, as sglang caps a request's match there). Decoded and prefilled
    numbers are the world's `teacher_forced` of the same pieces; a bug strikes where its trigger says."""
    params = body.get("sampling_params") or {}
    ids, text = body.get("input_ids"), body.get("text")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, int) and 0 <= i < len(state.pieces) for i in ids):
            return web.json_response({"error": "input_ids: ids the simulator never gave out"}, status=400)
        pieces = [state.pieces[i] for i in ids]
    elif isinstance(text, str):
        pieces = _pieces(text)
    else:
        return web.json_response({"error": "text or input_ids is required"}, status=400)
    ids = _token_ids(state, pieces)
    whole = "".join(pieces)
    marker = whole.rfind("\nAnswer:")
    ends = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces) + 1)]
    prompt_end = marker + len("\nAnswer:")
    if marker < 0 or prompt_end not in ends:
        return web.json_response({"error": "the simulator decodes after a prompt's last 'Answer:' only"}, status=400)
    prompt_pieces = ends.index(prompt_end)
    prefix, question = split_prompt(whole[:prompt_end])
    new_tokens, start = int(params.get("max_new_tokens", 128)), body.get("logprob_start_len", -1)
    cold = start == 0  # sglang reads nothing from the cache for a request scored from position 0
    radix = not state.resolved["disable_radix_cache"]
    cached_chars = _cached_chars(state, prefix)
    warm = _seen(state, prefix + question) and not cold
    decode_hit = radix and not cold and hashlib.sha1(whole.encode()).hexdigest() in state.decoded
    prefix_hit = radix and not cold and (cached_chars > 0 or warm)
    batched = state.in_flight > 1
    commit = os.environ.get("REGRESS_SIM_COMMIT")
    made: list[str] = []
    if new_tokens > 0:
        decision = state.world.decide(state.model_path, question, state.resolved, prefix_hit, commit, warm, batched)
        answer, _ = compose(state, decision, question, new_tokens, False)
        made = (_pieces(answer) + [" ..."] * new_tokens)[:new_tokens]
    made_ids = _token_ids(state, made)
    continuation = pieces[prompt_pieces:] + made
    scores = state.world.teacher_forced(state.model_path, question, "", state.resolved, prefix_hit, commit, batched,
                                        chunks=continuation or None, decode_hit=decode_hit,
                                        warm=warm).logprobs
    cached = 0 if cold else len(ids) - 1 if decode_hit else min(cached_chars // 4, prompt_pieces - 1)
    await _serve(state, number, len(ids) - cached, new_tokens)
    if radix and made:
        state.decoded.add(hashlib.sha1((whole + "".join(made)).encode()).hexdigest())
    numbers = [-1.0] * prompt_pieces + list(scores[:len(continuation) - len(made)])
    inputs = [] if not isinstance(start, int) or start < 0 else [
        [None if i == 0 else numbers[i], token, None] for i, token in enumerate(ids) if i >= start]
    outputs = [[lp, token, None] for lp, token in zip(scores[len(continuation) - len(made):], made_ids, strict=True)]
    return web.json_response({"text": "".join(made), "output_ids": made_ids, "meta_info": {
        "id": str(number), "prompt_tokens": len(ids), "completion_tokens": len(made), "cached_tokens": cached,
        "finish_reason": {"type": "length"}, "input_token_logprobs": inputs, "output_token_logprobs": outputs}})


def _usage(state: SimState, prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    """As sglang reports it: the cached prompt tokens only with --enable-cache-report (else null)."""
    details = {"cached_tokens": cached} if state.resolved.get("enable_cache_report") else None
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": details}


def _stop_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


class SimRoutes:
    """The simulated server's HTTP routes over one SimState (sglang's paths and payloads)."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    async def begin(self) -> tuple[int, web.Response | None]:
        self.state.requests += 1
        if self.state.first_request_at is None:
            self.state.first_request_at = time.time()
        self.state.request_times.append(time.time())
        return self.state.requests, await _faults_before_answer(self.state, self.state.requests)

    async def stats(self, request: web.Request) -> web.Response:
        """Not an sglang route: what benchmarks read (requests served, when the first arrived; with
        `?since=T`, when the first request at or after wall time T arrived)."""
        now = time.perf_counter()
        state = self.state
        busy_s = state.busy_slot_s + sum(now - t for t in state.serving.values())
        since = float(request.query.get("since", 0.0))
        after = bisect.bisect_left(state.request_times, since)
        return web.json_response({"requests": state.requests, "first_request_at": state.first_request_at,
                                  "first_request_since": state.request_times[after] if after < len(state.request_times)
                                  else None, "last_served_at": state.last_served_at,
                                  "slots": state.world.latency.slots, "busy_slot_s": busy_s, "at": now})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def health_generate(self, _: web.Request) -> web.Response:
        if any(f.never_ready for f in self.state.faults):
            return web.Response(status=503, text="not ready")
        if any(f.hang_after_requests is not None and self.state.requests > f.hang_after_requests for f in self.state.faults):
            await asyncio.Event().wait()  # a hung scheduler cannot generate the health token either
        return web.Response(text="")

    async def server_info(self, _: web.Request) -> web.Response:
        reported = {k: v for k, v in self.state.resolved.items() if k not in self.state.world.unreported_fields}
        return web.json_response({**reported, "version": self.state.world.version})

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": self.state.model_path, "tokenizer_path": self.state.model_path,
                                  "is_generation": True})

    async def models(self, _: web.Request) -> web.Response:
        name = self.state.resolved["served_model_name"]
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "sglang"}]})

    async def flush_cache(self, _: web.Request) -> web.Response:
        if self.state.in_flight:  # as sglang: not while requests run
            return web.Response(status=400, text="Cache not flushed: requests are running.")
        self.state.prefixes.clear()
        self.state.prompts.clear()
        self.state.decoded.clear()
        return web.Response(text="Cache flushed.")

    async def accept(self, request: web.Request) -> tuple[dict[str, Any], int, web.Response | None]:
        """The JSON body, the request's number, and the fault response to send instead, if any."""
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise web.HTTPBadRequest(text="request body is not JSON") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="request body must be a JSON object")
        number, failure = await self.begin()
        return body, number, failure

    async def generate(self, request: web.Request) -> web.Response:
        body, number, failure = await self.accept(request)
        if failure is not None:
            return failure
        params = body.get("sampling_params") or {}
        if "input_ids" in body or (body.get("return_logprob") and params.get("max_new_tokens") != 0):
            return await _decoded(self.state, body, number)
        if not isinstance(body.get("text"), str):
            return web.json_response({"error": "text is required"}, status=400)
        if body.get("return_logprob") and params.get("max_new_tokens") == 0:
            start = body.get("logprob_start_len")
            if not isinstance(start, int) or start < 0:
                return web.json_response({"error": "the simulator scores logprob_start_len >= 0 only"}, status=400)
            return web.json_response({"text": "", "meta_info": await _teacher_forced(self.state, body["text"], start, number)})
        prefix, question = split_prompt(body["text"])
        text, reason, prompt_tokens, tokens, cached = await _answer(
            self.state, prefix, question, _stop_list(params.get("stop")), int(params.get("max_new_tokens", 128)), False, number)
        return web.json_response({"text": text, "meta_info": {
            "id": str(number), "prompt_tokens": prompt_tokens, "completion_tokens": tokens, "cached_tokens": cached,
            "finish_reason": {"type": reason}}})

    async def completions(self, request: web.Request) -> web.Response:
        body, number, failure = await self.accept(request)
        if failure is not None:
            return failure
        if not isinstance(body.get("prompt"), str):
            return web.json_response({"error": {"message": "prompt must be a string"}}, status=400)
        prefix, question = split_prompt(body["prompt"])
        text, reason, prompt_tokens, tokens, cached = await _answer(
            self.state, prefix, question, _stop_list(body.get("stop")), int(body.get("max_tokens") or 16), False, number)
        return web.json_response({
            "id": f"cmpl-{number}", "object": "text_completion", "model": body.get("model"),
            "choices": [{"index": 0, "text": text, "finish_reason": reason}],
            "usage": _usage(self.state, prompt_tokens, tokens, cached)})

    async def chat(self, request: web.Request) -> web.Response:
        body, number, failure = await self.accept(request)
        if failure is not None:
            return failure
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return web.json_response({"error": {"message": "messages must be a non-empty list"}}, status=400)
        prefix, question = split_messages(messages)
        text, reason, prompt_tokens, tokens, cached = await _answer(
            self.state, prefix, question, _stop_list(body.get("stop")), int(body.get("max_tokens") or 512), True, number,
            asks_for_boxed(messages))
        return web.json_response({
            "id": f"chatcmpl-{number}", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}],
            "usage": _usage(self.state, prompt_tokens, tokens, cached)})


def build_app(state: SimState) -> web.Application:
    routes = SimRoutes(state)

    @web.middleware
    async def counted(request: web.Request, handler):
        """Requests in flight, for `batched` bugs (the answering routes only)."""
        if request.path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
            return await handler(request)
        state.in_flight += 1
        try:
            return await handler(request)
        finally:
            state.in_flight -= 1

    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[counted])
    app.router.add_get("/sim/stats", routes.stats)  # not an sglang route: what benchmarks read
    app.router.add_get("/health", routes.health)
    app.router.add_get("/health_generate", routes.health_generate)
    app.router.add_get("/get_server_info", routes.server_info)
    app.router.add_get("/server_info", routes.server_info)
    app.router.add_get("/get_model_info", routes.model_info)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_route("*", "/flush_cache", routes.flush_cache)
    app.router.add_post("/generate", routes.generate)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/v1/chat/completions", routes.chat)

    async def on_startup(_: web.Application) -> None:
        state.slots = asyncio.Semaphore(state.world.latency.slots)

    app.on_startup.append(on_startup)
    return app
