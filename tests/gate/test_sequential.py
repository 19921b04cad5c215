"""Sequential early stop: broken cells stop at the first look, healthy ones never do."""

from __future__ import annotations

import random

from harness.gate.sequential import EarlyStop, looks
from harness.results.records import QuestionRecord


def answers(pattern: list[bool]) -> list[QuestionRecord]:
    return [QuestionRecord(index=i, prompt_sha="s", gold="1", pred="1", correct=ok, finish_reason="stop", output="",
                           latency_s=0, output_tokens=1) for i, ok in enumerate(pattern)]


def first_stop(rule: EarlyStop, pattern: list[bool]) -> int | None:
    records = answers(pattern)
    for n in range(1, len(records) + 1):
        if rule.check(records[:n]):
            return n
    return None


def test_looks_double_from_20():
    assert looks(200) == [20, 40, 80, 160] and looks(20) == []


def test_a_broken_cell_stops_at_the_first_look():
    rng = random.Random(0)
    for _ in range(50):
        pattern = [rng.random() < 0.2 for _ in range(200)]
        assert first_stop(EarlyStop(floor=0.85, total=200), pattern) == 20


def test_healthy_cells_do_not_stop():
    rng = random.Random(1)
    stops = sum(first_stop(EarlyStop(floor=0.85, total=1319), [rng.random() < 0.9 for _ in range(1319)]) is not None
                for _ in range(300))
    assert stops == 0


def test_no_floor_means_no_early_stop():
    assert first_stop(EarlyStop(floor=0.0, total=200), [False] * 200) is None


def test_the_carried_critical_counts_are_exactly_the_tests_decisions():
    from harness.gate.stats import below_floor_p

    for floor, total in ((0.85, 1319), (0.5, 200), (0.99, 100)):
        rule = EarlyStop(floor=floor, total=total)
        level = rule.alpha / len(looks(total))
        for n, limit in rule.thresholds:
            decisions = [below_floor_p(c, n, floor) < level for c in range(n + 1)]
            assert decisions == [c <= limit for c in range(n + 1)], (floor, n)
