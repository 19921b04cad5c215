"""Asking a cell about itself: a seeded sample of its questions asked again after its evaluation,
so that a cell carries evidence that needs no reference cell (the reference may be the broken one).

For each sampled question whose teacher text was scored (harness.benchmark.evaluator):

1. `alone`, one at a time with nothing else in flight: the teacher text scored again. The prefix
   cache is as warm as in the evaluation; only the batch differs (alone, not among `concurrency`
   other requests): a request whose result depends on what it is batched with (cross-request
   contamination) shows here.
2. `replay`, `concurrency` at a time: the question answered again, its whole prompt in the cache
   since the evaluation: a server right cold and wrong warm (sglang PR #16053: GSM8K 0.950 on a
   first run, 0.485 on a second) shows here.
3. `cold`, one at a time: the server's prefix cache flushed (the engine's flush route), then the
   teacher text scored once more, computed from scratch where `alone` read the cache. A cache hit
   that reads wrong KV rows shows here, in the reference cell too. (Last: each flush empties the
   cache the replays need.)

The gate compares them (harness.gate.self_checks). A server without teacher forcing or a flush
route gets the checks it can: what was not measured is said so, never passed.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from harness.benchmark.base import ProtocolPlan
from harness.records import QuestionRecord, Replay, SelfChecks, TeacherForced

if TYPE_CHECKING:
    from harness.benchmark.evaluator import EvalSettings, Sender

FLUSH_ATTEMPTS = 10  # sglang refuses a flush while requests run; the evaluation's last ones may still finish


def sample(records: list[QuestionRecord], count: int, seed: int) -> list[int]:
    """Positions of the seeded sample: answered questions whose teacher text was scored."""
    eligible = [i for i, r in enumerate(records) if r.error is None and r.teacher is not None and not r.teacher.error]
    if count <= 0 or not eligible:
        return []
    return sorted(random.Random(seed).sample(eligible, min(count, len(eligible))))


async def run_self_checks(send: Sender, flush: callable, plan: ProtocolPlan, records: list[QuestionRecord],
                          settings: EvalSettings) -> list[QuestionRecord]:
    """`records` with `checks` filled in for the sampled questions (see the module docstring).
    `flush`: an async callable that empties the server's prefix cache (None: no flush route)."""
    from harness.benchmark.evaluator import TEACHER, _with_retries, request_body, teacher_body

    chosen = sample(records, settings.self_checks, settings.self_check_seed)
    prompts = {p.index: p for p in plan.prompts}
    checks: dict[int, dict] = {position: {} for position in chosen}

    async def teacher(position: int) -> TeacherForced:
        record = records[position]
        body = teacher_body(prompts[record.index], record.teacher.start)
        attempted = await _with_retries(send, "/generate", body, TEACHER, settings)
        return attempted.result if attempted.result is not None else TeacherForced(error=attempted.error)

    for position in chosen:
        checks[position]["alone"] = await teacher(position)

    async def replay(position: int) -> None:
        record = records[position]
        route, body = request_body(plan, prompts[record.index], settings.model_name)
        attempted = await _with_retries(send, route, body, plan.endpoint, settings)
        if attempted.result is None:
            checks[position]["replay"] = Replay(error=attempted.error)
            return
        grade = plan.grade(attempted.result.text, record.gold)
        checks[position]["replay"] = Replay(pred=grade.pred, correct=grade.correct, correct_strict=grade.correct_strict,
                                            output=attempted.result.text, cached_tokens=attempted.result.cached_tokens)

    queue = list(chosen)

    async def worker() -> None:
        while queue:
            await replay(queue.pop())

    await asyncio.gather(*(worker() for _ in range(min(settings.concurrency, len(queue)))))
    if flush is not None:
        for position in chosen:
            problem = await flush()
            checks[position]["cold"] = await teacher(position) if problem is None else TeacherForced(error=problem)
    updated = list(records)
    for position, found in checks.items():
        updated[position] = updated[position].model_copy(update={"checks": SelfChecks(**found)})
    return updated
