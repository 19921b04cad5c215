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
3. `decode`, one at a time: the prompt decoded again from scratch, a follow-up that reads the KV
   rows that decode wrote (a decode-cache hit), and both decodes' tokens prefilled from scratch
   (harness.benchmark.decode_check): a decode path, or a cache hit on decoded rows, that computes
   other numbers than a prefill of the same tokens shows here.
4. `cold`, one at a time: the server's prefix cache flushed (the engine's flush route), then the
   teacher text scored once more, computed from scratch where `alone` read the cache. A cache hit
   that reads wrong KV rows shows here, in the reference cell too. (Last: each flush empties the
   cache the replays need.)

The gate compares them (harness.gate.self_checks). A server without teacher forcing or a flush
route gets the checks it can: what was not measured is said so, never passed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from harness.records import DecodeCheck, QuestionRecord, Replay, SelfChecks, TeacherForced


def sample(records: list[QuestionRecord], count: int, seed: int) -> list[int]:
    """Positions of the seeded sample: answered questions whose teacher text was scored."""
    eligible = [i for i, r in enumerate(records) if r.error is None and r.teacher is not None and not r.teacher.error]
    if count <= 0 or not eligible:
        return []
    return sorted(random.Random(seed).sample(eligible, min(count, len(eligible))))


async def run_self_checks(teacher: Callable[[QuestionRecord], Awaitable[TeacherForced]],
                          answer: Callable[[QuestionRecord], Awaitable[Replay]],
                          flush: Callable[[], Awaitable[str | None]] | None, records: list[QuestionRecord],
                          count: int, seed: int, concurrency: int,
                          decode: Callable[[QuestionRecord], Awaitable[DecodeCheck]] | None = None) -> list[QuestionRecord]:
    """`records` with `checks` filled in for `count` sampled questions (see the module docstring):
    `teacher` scores a record's teacher text again, `answer` asks its question again, `flush`
    empties the server's prefix cache (None: no flush route; None back: flushed, else why not),
    `decode` makes a record's decode check (None: not asked)."""
    chosen = sample(records, count, seed)
    checks: dict[int, dict] = {position: {} for position in chosen}
    for position in chosen:
        checks[position]["alone"] = await teacher(records[position])
    queue = list(chosen)

    async def worker() -> None:
        while queue:
            position = queue.pop()
            checks[position]["replay"] = await answer(records[position])

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(queue)))))
    if decode is not None:
        for position in chosen:
            checks[position]["decode"] = await decode(records[position])
    if flush is not None:
        for position in chosen:
            problem = await flush()
            checks[position]["cold"] = await teacher(records[position]) if problem is None else TeacherForced(error=problem)
    updated = list(records)
    for position, found in checks.items():
        updated[position] = updated[position].model_copy(update={"checks": SelfChecks(**found)})
    return updated
