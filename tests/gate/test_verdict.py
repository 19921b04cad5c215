"""Verdicts from measurements: floors, paired comparisons, errors and mismatches."""

from __future__ import annotations

from harness.errors import ErrorKind
from harness.gate.stats import paired_comparison, wilson_interval
from harness.gate.verdict import judge
from harness.gsm8k.evaluator import score
from harness.results.records import CellError, CellOutcome, QuestionRecord, Status
from harness.suite.config import GateSpec

GATE = GateSpec(alpha=0.01, min_effect=0.02)


def records(pattern: list[bool], errors: int = 0) -> list[QuestionRecord]:
    out = [QuestionRecord(index=i, prompt_sha="x", gold="1", pred="1" if ok else "2", correct=ok, correct_strict=ok,
                          finish_reason="stop", output="", latency_s=0.0, output_tokens=1)
           for i, ok in enumerate(pattern)]
    out += [QuestionRecord(index=len(pattern) + i, prompt_sha="x", gold="1", pred=None, correct=False,
                           finish_reason=None, output="", latency_s=0.0, output_tokens=0, error="HTTP 503")
            for i in range(errors)]
    return out


def outcome(pattern: list[bool], errors: int = 0, **kwargs) -> CellOutcome:
    recs = records(pattern, errors)
    return CellOutcome(cell_id="c", args=[], score=score(recs, 1.0), questions=recs, **kwargs)


HEALTHY = [i % 10 != 0 for i in range(200)]  # 0.90


def test_healthy_cell_passes_with_interval():
    verdict = judge(outcome(HEALTHY), floor=0.85, gate=GATE, cells_tested=32)
    assert verdict.status is Status.PASS and verdict.n == 200 and verdict.accuracy == 0.9
    assert verdict.ci_low < 0.9 < verdict.ci_high


def test_far_below_floor_fails_with_numbers_in_reason():
    broken = [i % 5 == 0 for i in range(200)]  # 0.20
    verdict = judge(outcome(broken), floor=0.85, gate=GATE, cells_tested=32)
    assert verdict.status is Status.FAIL and "below floor 0.85" in verdict.reason and "40/200" in verdict.reason


def test_slightly_under_floor_is_inconclusive_not_fail():
    near = [i % 100 >= 16 for i in range(200)]  # 0.84
    assert judge(outcome(near), floor=0.85, gate=GATE, cells_tested=32).status is Status.INCONCLUSIVE


def test_paired_drop_against_reference_fails_even_above_floor():
    reference = outcome([True] * 190 + [False] * 10)  # 0.95
    dropped = outcome([True] * 170 + [False] * 30)  # 0.85: lost 20, gained 0
    verdict = judge(dropped, floor=0.5, gate=GATE, cells_tested=32, reference=reference)
    assert verdict.status is Status.FAIL and verdict.mcnemar_p < 1e-4 and "lost 20, gained 0" in verdict.reason


def test_paired_small_noise_passes():
    reference = outcome(HEALTHY)
    noisy = list(HEALTHY)
    noisy[1], noisy[0] = False, True  # one loss, one gain
    verdict = judge(outcome(noisy), floor=0.85, gate=GATE, cells_tested=32, reference=reference)
    assert verdict.status is Status.PASS and verdict.agreement == 0.99


def test_transport_failures_make_error_not_fail():
    verdict = judge(outcome(HEALTHY, errors=30), floor=0.85, gate=GATE, cells_tested=32)
    assert verdict.status is Status.ERROR and "30 of 230" in verdict.reason and "HTTP 503" in verdict.reason


def test_errors_and_mismatches_win():
    crashed = CellOutcome(cell_id="c", args=[], error=CellError(kind=ErrorKind.CRASHED, message="server exited"))
    verdict = judge(crashed, 0.85, GATE, 1)
    assert verdict.status is Status.ERROR and verdict.error_kind is ErrorKind.CRASHED
    assert judge(outcome(HEALTHY, errors=30), 0.85, GATE, 32).error_kind is ErrorKind.TRANSPORT
    mismatch = outcome(HEALTHY, mismatches=["disable_radix_cache: requested False, resolved True"])
    verdict = judge(mismatch, 0.85, GATE, 1)
    assert verdict.status is Status.MISMATCH and "disable_radix_cache" in verdict.reason


def test_strict_extraction_is_used_when_configured():
    recs = [r.model_copy(update={"correct_strict": False}) for r in records(HEALTHY)]
    cell = CellOutcome(cell_id="c", args=[], score=score(recs, 1.0), questions=recs)
    assert judge(cell, 0.85, GateSpec(extraction="strict"), 1).status is Status.FAIL


def test_wilson_and_paired_statistics():
    low, high = wilson_interval(180, 200)
    assert 0.85 < low < 0.86 and 0.93 < high < 0.94
    paired = paired_comparison({0: True, 1: False, 2: True}, {0: True, 1: True, 2: False})
    assert (paired.losses, paired.gains, paired.n) == (1, 1, 3) and paired.p_drop == 0.75
    assert paired_comparison({0: True}, {1: True}) is None


def test_history_pairing_catches_a_drop_that_the_reference_shares():
    """Everything broke together: the reference cannot see it, the last passing run can."""
    yesterday = outcome([True] * 190 + [False] * 10)  # 0.95
    today = outcome([True] * 165 + [False] * 35)  # 0.825, and the reference dropped alike
    verdict = judge(today, floor=0.5, gate=GATE, cells_tested=32, reference=today, history=yesterday)
    assert verdict.status is Status.FAIL and verdict.history_p < 1e-5
    assert "vs the last passing run 0.950" in verdict.reason and "lost 25, gained 0" in verdict.reason


# ---- the audit's holes (issue 15): a broken or missing reference never vouches for a cell ----------
FIVE_POINTS_DOWN = [i % 20 not in (0, 1, 2) for i in range(200)]  # 0.85: 5 points under 0.90


def test_a_cell_whose_reference_errored_is_not_a_pass():
    verdict = judge(outcome(FIVE_POINTS_DOWN), 0.5, GATE, 32, reference=None,
                    reference_problem="reference unavailable: m.ab-triton (server exited with code 1)")
    assert verdict.status is Status.INCONCLUSIVE and "reference unavailable" in verdict.reason


def test_a_reference_that_stopped_early_shares_too_few_questions_to_vouch():
    stopped = outcome([True] * 20)  # 20 answers, all right, then stopped
    verdict = judge(outcome(FIVE_POINTS_DOWN), 0.5, GATE, 32, reference=stopped)
    assert verdict.status is Status.INCONCLUSIVE and "only 20 questions shared of the cell's 200" in verdict.reason


def test_a_drop_against_history_that_is_not_significant_is_inconclusive_like_one_against_the_reference():
    history = outcome(HEALTHY)
    drop = list(HEALTHY)
    for i in range(1, 9):  # 8 losses, 0 gains on 200: a 4-point drop, not significant at alpha/32
        drop[i] = False
    verdict = judge(outcome(drop), 0.5, GATE, 32, history=history)
    assert verdict.history_p is not None and verdict.history_p > GATE.alpha / 32
    assert verdict.status is Status.INCONCLUSIVE


def test_alpha_is_split_over_the_tests_actually_made():
    """Floor only: the whole per-cell share. Floor, reference and history: a third of it each."""
    borderline = [i % 100 >= 22 for i in range(200)]  # 0.78 against a floor of 0.85
    alone = judge(outcome(borderline), 0.85, GATE, 1)
    assert alone.status is Status.FAIL and f"< {GATE.alpha:.2g}" in alone.reason
    three = judge(outcome(borderline), 0.85, GATE, 1, reference=outcome(borderline), history=outcome(borderline))
    assert three.floor_p == alone.floor_p and GATE.alpha / 3 < three.floor_p < GATE.alpha
    assert three.status is Status.INCONCLUSIVE  # the same evidence, weighed against a third of the alpha
