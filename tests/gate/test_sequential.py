"""Sequential early stop: broken cells stop at the first look, healthy ones never do."""

from __future__ import annotations

import random

from harness.gate.sequential import EarlyStop, Looks, looks
from harness.records import QuestionRecord
from tests.records import answers


def first_stop(rule: EarlyStop, pattern: list[bool]) -> int | None:
    looks = Looks(rule)
    for n, record in enumerate(answers(pattern), start=1):
        if looks.add(record):
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


def test_looks_test_prefixes_of_the_seeded_order_not_the_fastest_answers():
    """A kernel bug that writes junk up to the token limit answers last. Looks at whatever came back
    first would see only the healthy answers; looks at the seeded order's prefixes see a random sample."""
    order = tuple(range(1000, 1200))  # the plan's question indices, in its seeded order
    broken = {index: (k % 5 == 0) for k, index in enumerate(order)}  # 20% right, like the incident
    fast_first = sorted(order, key=lambda index: not broken[index])  # right answers come back first
    records = [QuestionRecord(index=i, prompt_sha="s", gold="1", pred="1", correct=broken[i], finish_reason="stop",
                              output="", latency_s=0, output_tokens=1) for i in fast_first]
    rule = EarlyStop(floor=0.85, total=200, order=order)
    looks_ = Looks(rule)
    stops = [(n, reason) for n, record in enumerate(records, start=1) if (reason := looks_.add(record))]
    stopped_at, reason = stops[0]
    assert stopped_at > 20  # it waited for the first 20 of the seeded order
    assert "after the first 20 answered questions of the seeded order: 4 correct" in reason
    old_rule_sample = records[:20]  # what a completion-order look would have tested: all right
    assert all(r.correct for r in old_rule_sample)


def test_a_transport_failure_is_passed_over_not_a_hold_on_every_look():
    rows = answers([False] * 40)
    rows[3] = rows[3].model_copy(update={"error": "HTTP 503"})
    rule = EarlyStop(floor=0.85, total=200)
    assert rule.check(rows[:20]) is None  # 19 answers so far: the first look needs 20
    assert "after the first 20 answered questions of the seeded order: 0 correct" in rule.check(rows[:21])
