"""The async evaluator: asks every prompt of a benchmark plan against one server and grades it with the plan.

Transport failures are never scores. Timeouts, connection errors, 5xx, 429 and malformed 200
responses are retried with exponential backoff (honouring Retry-After); a question that still fails
is recorded with `error` set and left out of the accuracy. Other 4xx are not retried: the record
says what the server answered. The gate turns a high share of such failures into `error`.

One aiohttp session with a pooled connector and `concurrency` worker coroutines keep the server
busy at about 0.2 ms of client CPU per request (the openai SDK costs ~1.5 ms, see FACTS.md).

After a question is answered, and when its prompt has a teacher text, a second request scores that
text teacher-forced (sglang's `/generate`: `return_logprob`, `logprob_start_len` one before the
continuation, `top_logprobs_num` 1, no new token): prefill only. It starts one token before the
continuation because sglang caps a request's prefix-cache match at its `logprob_start_len` and does
not compute the first position's log-probability; so the prompt is still served from the prefix
cache, as the answer's was, and every continuation token gets its log-probability.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from harness.benchmark.base import Prompt, ProtocolPlan
from harness.benchmark.decode_check import Decoded, decode_check
from harness.benchmark.http import (
    ANSWER_LIMIT_BYTES,
    BodyTooLarge,
    bounded_body,
    bounded_json,
    flush_cache,
    redirect_of,
)
from harness.benchmark.scoring import score
from harness.records import DecodeCheck, QuestionRecord, Replay, Score, TeacherForced

RETRYABLE_STATUS = {429, 500, 502, 503, 504}


@dataclass(frozen=True)
class EvalSettings:
    concurrency: int = 256
    request_timeout_s: float = 600.0
    max_attempts: int = 6
    # All attempts at one question together (a server that sends a byte a second never times one
    # request out early, and 6 attempts of 600 s would be an hour a question).
    question_deadline_s: float = 900.0
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 8.0
    model_name: str = "default"
    # "aiohttp" (default, ~0.2 ms CPU/request) or "openai" (the SDK, ~1.5 ms; for servers that need
    # its auth or quirks). `/generate` always goes through aiohttp: it is not an OpenAI route.
    client: str = "aiohttp"
    api_key: str | None = None
    teacher_forcing: bool = True  # score each prompt's teacher text (gate.divergence needs it)
    # After the evaluation, this many sampled questions asked again inside the cell
    # (harness.benchmark.self_checks); 0: none. `flush_route`: the engine's route that empties its
    # prefix cache (None: the cold check is not made).
    self_checks: int = 0
    self_check_seed: int = 0
    flush_route: str | None = None


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    correct: int
    failures: int
    elapsed_s: float


class _Retryable(Exception):
    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _Final(Exception):
    """A response that retrying will not fix (a 4xx other than 429)."""


@dataclass(frozen=True)
class _Answer:
    text: str
    finish_reason: str | None
    output_tokens: int
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache; None: not reported
    prompt_tokens: int | None = None


def _cached_tokens(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_body(plan: ProtocolPlan, prompt: Prompt, model_name: str) -> tuple[str, dict[str, Any]]:
    """The route and JSON body of one question for the plan's endpoint."""
    if plan.endpoint == "generate":
        return "/generate", {"text": prompt.text, "sampling_params": {
            "max_new_tokens": plan.max_tokens, "temperature": plan.temperature, "stop": list(plan.stop)}}
    common = {"model": model_name, "max_tokens": plan.max_tokens, "temperature": plan.temperature}
    if plan.stop:
        common["stop"] = list(plan.stop)
    if plan.endpoint == "chat":
        messages = [{"role": role, "content": content} for role, content in prompt.messages or ()]
        return "/v1/chat/completions", {**common, "messages": messages}
    return "/v1/completions", {**common, "prompt": prompt.text}


def parse_answer(endpoint: str, payload: Any) -> _Answer:
    """Read text, finish reason and token count; a malformed payload raises _Retryable."""
    try:
        if endpoint == "generate":
            meta = payload["meta_info"]
            reason = meta.get("finish_reason")
            if isinstance(reason, dict):  # sglang: {"type": "stop", "matched": ...}
                reason = reason.get("type")
            return _Answer(str(payload["text"]), reason, int(meta.get("completion_tokens", 0)),
                           _cached_tokens(meta.get("cached_tokens")), _cached_tokens(meta.get("prompt_tokens")))
        choice = payload["choices"][0]
        text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
        if text is None:
            text = ""
        usage = payload.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}  # sglang: with --enable-cache-report
        return _Answer(str(text), choice.get("finish_reason"), int(usage.get("completion_tokens", 0)),
                       _cached_tokens(details.get("cached_tokens") if isinstance(details, dict) else None),
                       _cached_tokens(usage.get("prompt_tokens")))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise _Retryable(f"malformed response ({type(error).__name__}: {error})") from None


TEACHER = "teacher"  # the teacher-forced request's "endpoint": sglang's /generate, parsed by parse_teacher


def teacher_body(prompt: Prompt, prompt_tokens: int) -> dict[str, Any]:
    """The teacher-forced request of one answered question (see the module docstring)."""
    return {"text": (prompt.text or "") + (prompt.teacher or ""),
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": prompt_tokens - 1, "top_logprobs_num": 1}


def parse_teacher(payload: Any) -> TeacherForced:
    """The continuation's tokens, log-probabilities and top-1 tokens; the first entry (the prompt's
    last token, which sglang returns without a log-probability) is dropped. Malformed: _Retryable."""
    try:
        meta = payload["meta_info"]
        entries, tops = meta["input_token_logprobs"][1:], meta["input_top_logprobs"][1:]
        if len(entries) != len(tops) or any(entry[0] is None for entry in entries):
            raise ValueError("log-probabilities missing")
        prompt_tokens = int(meta["prompt_tokens"]) - len(entries)
        return TeacherForced(start=prompt_tokens, token_ids=[int(e[1]) for e in entries],
                             logprobs=[float(e[0]) for e in entries], top_ids=[int(t[0][1]) for t in tops],
                             cached_tokens=_cached_tokens(meta.get("cached_tokens")))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise _Retryable(f"malformed teacher-forced response ({type(error).__name__}: {error})") from None


DECODE = "decode"  # the decode self-check's requests (harness.benchmark.decode_check), parsed by parse_decoded


def parse_decoded(payload: Any) -> Decoded:
    """Token ids and log-probabilities of a `/generate` answer with `return_logprob`; a server that
    returns none gives empty lists (the check then says what is missing). Malformed: _Retryable."""
    try:
        meta = payload["meta_info"]
        inputs, outputs = meta.get("input_token_logprobs") or [], meta.get("output_token_logprobs") or []
        return Decoded(input_ids=[int(e[1]) for e in inputs], input_logprobs=[e[0] for e in inputs],
                       output_ids=[int(e[1]) for e in outputs], output_logprobs=[e[0] for e in outputs],
                       cached_tokens=_cached_tokens(meta.get("cached_tokens")))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise _Retryable(f"malformed response ({type(error).__name__}: {error})") from None


_PARSERS: dict[str, Callable[[Any], Any]] = {TEACHER: parse_teacher, DECODE: parse_decoded}


async def _ask_once(session: aiohttp.ClientSession, base_url: str, route: str, body: dict[str, Any],
                    endpoint: str) -> _Answer:
    """One HTTP attempt with aiohttp; raises _Retryable or _Final on failure."""
    try:
        async with session.post(base_url + route, json=body, allow_redirects=False) as response:
            if response.status in RETRYABLE_STATUS:
                retry_after = response.headers.get("Retry-After")
                delay = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
                raise _Retryable(f"HTTP {response.status}", delay)
            redirect = redirect_of(response)
            if redirect:
                raise _Final(redirect)
            if response.status >= 400:
                text = (await bounded_body(response, ANSWER_LIMIT_BYTES))[:300].decode(errors="replace")
                raise _Final(f"HTTP {response.status}: {text}")
            try:
                payload = await bounded_json(response, ANSWER_LIMIT_BYTES)
            except ValueError:
                raise _Retryable("malformed response (body is not JSON)") from None
    except BodyTooLarge as error:
        raise _Final(str(error)) from None
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        raise _Retryable(f"{type(error).__name__}: {error}".rstrip(": ")) from None
    return _PARSERS[endpoint](payload) if endpoint in _PARSERS else parse_answer(endpoint, payload)


Sender = Callable[[str, dict[str, Any], str], Awaitable[Any]]


def _reporting(send: Sender, on_answer: Callable[[], None] | None) -> Sender:
    """`send`, calling `on_answer` after each answer the server gives (`send` as is when None)."""
    if on_answer is None:
        return send

    async def send_and_report(route: str, body: dict[str, Any], endpoint: str) -> Any:
        result = await send(route, body, endpoint)
        on_answer()
        return result

    return send_and_report


def _openai_sender(client: Any) -> Sender:
    import openai

    async def send(route: str, body: dict[str, Any], endpoint: str) -> _Answer:
        try:
            if endpoint == "chat":
                response = await client.chat.completions.create(**body)
            else:
                response = await client.completions.create(**body)
        except openai.APIStatusError as error:
            if error.status_code in RETRYABLE_STATUS:
                raise _Retryable(f"HTTP {error.status_code}") from None
            raise _Final(f"HTTP {error.status_code}: {str(error.message)[:300]}") from None
        except (openai.APIConnectionError, openai.APITimeoutError) as error:
            raise _Retryable(f"{type(error).__name__}: {error}") from None
        except ValueError as error:
            raise _Retryable(f"malformed response ({error})") from None
        return parse_answer(endpoint, response.model_dump())

    return send


@dataclass(frozen=True)
class _Attempted:
    result: Any  # what the sender parsed; None when every attempt failed
    error: str | None
    attempts: int
    latency_s: float  # of the last attempt: retries and their backoff are counted in `attempts`


async def _with_retries(send: Sender, route: str, body: dict[str, Any], endpoint: str,
                        settings: EvalSettings) -> _Attempted:
    """One request, retried with exponential backoff (honouring Retry-After) while retrying can help,
    all attempts within `settings.question_deadline_s`."""
    error: str | None = None
    attempt = 0
    latency = 0.0
    deadline = time.perf_counter() + settings.question_deadline_s
    for attempt in range(1, settings.max_attempts + 1):
        started = time.perf_counter()
        try:
            # asyncio.timeout, not wait_for: wait_for runs `send` as a task of its own, and a worker
            # cancelled (the cell stopped early) just as that task finished kept its answer.
            async with asyncio.timeout(max(deadline - started, 0.001)):
                result = await send(route, body, endpoint)
            return _Attempted(result, None, attempt, time.perf_counter() - started)
        except _Final as final:
            return _Attempted(None, str(final), attempt, time.perf_counter() - started)
        except asyncio.TimeoutError:
            return _Attempted(None, f"no answer within the question's deadline of {settings.question_deadline_s:g} s "
                                    f"({attempt} attempt{'s' * (attempt > 1)}; question_deadline_s)", attempt,
                              time.perf_counter() - started)
        except _Retryable as retryable:
            latency = time.perf_counter() - started
            error = f"{retryable} (after {attempt} attempt{'s' * (attempt > 1)})"
            if attempt == settings.max_attempts:
                break
            backoff = min(settings.backoff_max_s, settings.backoff_initial_s * 2 ** (attempt - 1))
            pause = min(settings.backoff_max_s, retryable.retry_after_s or backoff)
            if time.perf_counter() + pause >= deadline:
                error += f"; the question's deadline of {settings.question_deadline_s:g} s leaves no time for another"
                break
            await asyncio.sleep(pause)
    return _Attempted(None, error, attempt, latency)


async def _teacher_forced(send: Sender, prompt: Prompt, answer: _Answer, settings: EvalSettings) -> TeacherForced | None:
    """The question's teacher text scored teacher-forced on `/generate`; None when it has none."""
    if not settings.teacher_forcing or prompt.teacher is None or prompt.text is None:
        return None
    if not answer.prompt_tokens:
        return TeacherForced(error="the server reported no prompt_tokens for the answer")
    attempted = await _with_retries(send, "/generate", teacher_body(prompt, answer.prompt_tokens), TEACHER, settings)
    return attempted.result if attempted.result is not None else TeacherForced(error=attempted.error)


async def _ask(send: Sender, plan: ProtocolPlan, prompt: Prompt, settings: EvalSettings,
               teacher_send: Sender | None = None) -> QuestionRecord:
    route, body = request_body(plan, prompt, settings.model_name)
    attempted = await _with_retries(send, route, body, plan.endpoint, settings)
    answer: _Answer | None = attempted.result
    if answer is None:
        return QuestionRecord(index=prompt.index, split=prompt.split, prompt_sha=prompt.sha, gold=prompt.gold, pred=None,
                              correct=False, finish_reason=None, output="", latency_s=attempted.latency_s,
                              output_tokens=0, attempts=attempted.attempts, error=attempted.error)
    grade = plan.grade(answer.text, prompt.gold)
    teacher = await _teacher_forced(teacher_send or send, prompt, answer, settings)
    return QuestionRecord(index=prompt.index, split=prompt.split, prompt_sha=prompt.sha, gold=prompt.gold, pred=grade.pred,
                          pred_strict=grade.pred_strict, correct=grade.correct, correct_strict=grade.correct_strict,
                          finish_reason=answer.finish_reason, output=answer.text, latency_s=attempted.latency_s,
                          output_tokens=answer.output_tokens, attempts=attempted.attempts,
                          cached_tokens=answer.cached_tokens, teacher=teacher)


class _QuestionQueue:
    """The questions of one evaluation: handed out in plan order to `concurrency` workers, answers
    collected, progress reported, and everything stopped once `should_stop` says so."""

    def __init__(self, plan: ProtocolPlan, settings: EvalSettings, on_progress: Callable[[Progress], None] | None,
                 should_stop: Callable[[list[QuestionRecord]], bool] | None) -> None:
        self.plan, self.settings = plan, settings
        self.on_progress, self.should_stop = on_progress, should_stop
        self.pending = iter(enumerate(plan.prompts))
        self.records: dict[int, QuestionRecord] = {}
        self.finished: list[QuestionRecord] = []
        self.started = time.perf_counter()
        self.stop = asyncio.Event()
        self.correct = self.failures = 0
        self.workers: list[asyncio.Task[None]] = []

    async def worker(self, send: Sender, teacher_send: Sender) -> None:
        for position, prompt in self.pending:
            if self.stop.is_set():
                return
            record = await _ask(send, self.plan, prompt, self.settings, teacher_send)
            self.records[position] = record
            self.finished.append(record)
            self.correct += record.correct
            self.failures += record.error is not None
            if self.on_progress is not None:
                self.on_progress(Progress(len(self.finished), len(self.plan.prompts), self.correct, self.failures,
                                          time.perf_counter() - self.started))
            if self.should_stop is not None and self.should_stop(self.finished):
                # Stop now: the answers in flight are not needed, and cancelling them frees the server.
                self.stop.set()
                for task in self.workers:
                    if task is not asyncio.current_task():
                        task.cancel()
                return

    async def run(self, send: Sender, teacher_send: Sender) -> list[QuestionRecord]:
        """Every question (or until stopped), records in the plan's question order."""
        count = min(self.settings.concurrency, len(self.plan.prompts))
        self.workers += [asyncio.create_task(self.worker(send, teacher_send)) for _ in range(count)]
        try:
            outcomes = await asyncio.gather(*self.workers, return_exceptions=True)
            for result in outcomes:
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    raise result
        finally:
            for task in self.workers:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self.workers, return_exceptions=True)
        return [self.records[i] for i in sorted(self.records)]


async def evaluate(base_url: str, plan: ProtocolPlan, settings: EvalSettings = EvalSettings(),
                   on_progress: Callable[[Progress], None] | None = None,
                   should_stop: Callable[[list[QuestionRecord]], bool] | None = None,
                   on_answer: Callable[[], None] | None = None) -> tuple[Score, list[QuestionRecord]]:
    """Ask every prompt of `plan` against `base_url`; return the score and per-question records.

    `should_stop`, called after each answer with the records so far, ends the evaluation early
    (the sequential gate uses it). Records come back in the plan's question order.
    `on_answer` is called after every request the server answers: a question, its teacher text,
    the self-checks' teacher texts, replays and decode checks (not the cache flush: the cold text
    after it counts). It is the hang watch's heartbeat: on a slow server the self-checks alone can
    run for minutes after the last question was answered.
    """
    base_url = base_url.rstrip("/")
    asking = _QuestionQueue(plan, settings, on_progress, should_stop)
    connector = aiohttp.TCPConnector(limit=settings.concurrency, limit_per_host=settings.concurrency)
    timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s)
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else None
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(
            aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers))
        send: Sender = _reporting(functools.partial(_ask_once, session, base_url), on_answer)
        teacher_send = send  # `/generate` is not an OpenAI route: always aiohttp
        if settings.client == "openai" and plan.endpoint != "generate":
            import openai

            client = await stack.enter_async_context(openai.AsyncOpenAI(
                base_url=base_url + "/v1", api_key=settings.api_key or "none", max_retries=0,
                timeout=settings.request_timeout_s))
            send = _reporting(_openai_sender(client), on_answer)
        ordered = await asking.run(send, teacher_send)
        elapsed = time.perf_counter() - asking.started  # the evaluation's own time (its throughput)
        if settings.self_checks and not asking.stop.is_set():
            ordered = await _self_checks(session, base_url, teacher_send, plan, ordered, settings)
    return score(ordered, elapsed), ordered


async def _self_checks(session: aiohttp.ClientSession, base_url: str, send: Sender, plan: ProtocolPlan,
                       records: list[QuestionRecord], settings: EvalSettings) -> list[QuestionRecord]:
    """The cell's sampled questions asked again inside it (harness.benchmark.self_checks)."""
    from harness.benchmark.self_checks import run_self_checks

    prompts = {p.index: p for p in plan.prompts}

    async def teacher(record: QuestionRecord) -> TeacherForced:
        body = teacher_body(prompts[record.index], record.teacher.start if record.teacher else 0)
        attempted = await _with_retries(send, "/generate", body, TEACHER, settings)
        return attempted.result if attempted.result is not None else TeacherForced(error=attempted.error)

    async def answer(record: QuestionRecord) -> Replay:
        route, body = request_body(plan, prompts[record.index], settings.model_name)
        attempted = await _with_retries(send, route, body, plan.endpoint, settings)
        if attempted.result is None:
            return Replay(error=attempted.error)
        grade = plan.grade(attempted.result.text, record.gold)
        return Replay(pred=grade.pred, correct=grade.correct, correct_strict=grade.correct_strict,
                      output=attempted.result.text, cached_tokens=attempted.result.cached_tokens)

    async def post(body: dict[str, Any]) -> Decoded | str:
        attempted = await _with_retries(send, "/generate", body, DECODE, settings)
        return attempted.result if attempted.result is not None else str(attempted.error)

    async def decode(record: QuestionRecord) -> DecodeCheck:
        return await decode_check(post, prompts[record.index].text or "")

    flush = functools.partial(flush_cache, session, base_url + settings.flush_route) if settings.flush_route else None
    return await run_self_checks(teacher, answer, flush, records, settings.self_checks, settings.self_check_seed,
                                 settings.concurrency, decode)
