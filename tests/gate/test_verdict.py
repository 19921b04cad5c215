"""Verdicts from measurements: floors, paired comparisons, errors and mismatches."""

from __future__ import annotations

from harness.benchmark.gsm8k.protocol import EXTENSION_INDEX_OFFSET
from harness.errors import ErrorKind
from harness.gate.budget import Budget
from harness.gate.stats import drop_above_margin_p, paired_comparison, wilson_interval
from harness.gate.verdict import Stage, judge
from harness.records import CellError, CellOutcome, QuestionRecord, Status
from harness.suite.config import GateSpec
from tests.records import answers
from tests.records import outcome as of_records

GATE = GateSpec(alpha=0.01, tolerance=0.01, min_effect=0.03)
NIGHT = Stage(alpha=Budget(0.01, 32).stage(1))  # one cell of a 32-cell run that does not extend


def outcome(pattern: list[bool], errors: int = 0, **kwargs) -> CellOutcome:
    return of_records(answers(pattern, errors=errors), **kwargs)


HEALTHY = [i % 10 != 0 for i in range(200)]  # 0.90


def test_healthy_cell_passes_with_interval():
    verdict = judge(outcome(HEALTHY), floor=0.85, gate=GATE, stage=NIGHT)
    assert verdict.status is Status.PASS and verdict.n == 200 and verdict.accuracy == 0.9
    assert verdict.ci_low < 0.9 < verdict.ci_high


def test_far_below_floor_fails_with_numbers_in_reason():
    broken = [i % 5 == 0 for i in range(200)]  # 0.20
    verdict = judge(outcome(broken), floor=0.85, gate=GATE, stage=NIGHT)
    assert verdict.status is Status.FAIL and "below floor 0.85" in verdict.reason and "40/200" in verdict.reason


def test_slightly_under_floor_is_inconclusive_not_fail():
    near = [i % 100 >= 16 for i in range(200)]  # 0.84
    assert judge(outcome(near), floor=0.85, gate=GATE, stage=NIGHT).status is Status.INCONCLUSIVE


def test_paired_drop_against_reference_fails_even_above_floor():
    reference = outcome([True] * 190 + [False] * 10)  # 0.95
    dropped = outcome([True] * 170 + [False] * 30)  # 0.85: lost 20, gained 0
    verdict = judge(dropped, floor=0.5, gate=GATE, stage=NIGHT, reference=reference)
    assert verdict.status is Status.FAIL and verdict.mcnemar_p < 1e-4 and "lost 20, gained 0" in verdict.reason


def test_paired_small_noise_passes():
    reference = outcome(HEALTHY)
    noisy = list(HEALTHY)
    noisy[1], noisy[0] = False, True  # one loss, one gain
    verdict = judge(outcome(noisy), floor=0.85, gate=GATE, stage=NIGHT, reference=reference)
    assert verdict.status is Status.PASS and verdict.agreement == 0.99


def test_transport_failures_make_error_not_fail():
    verdict = judge(outcome(HEALTHY, errors=30), floor=0.85, gate=GATE, stage=NIGHT)
    assert verdict.status is Status.ERROR and "30 of 230" in verdict.reason and "HTTP 503" in verdict.reason


def test_errors_and_mismatches_win():
    crashed = CellOutcome(cell_id="c", args=[], error=CellError(kind=ErrorKind.CRASHED, message="server exited"))
    verdict = judge(crashed, 0.85, GATE, Stage(alpha=0.01))
    assert verdict.status is Status.ERROR and verdict.error_kind is ErrorKind.CRASHED
    assert judge(outcome(HEALTHY, errors=30), 0.85, GATE, NIGHT).error_kind is ErrorKind.TRANSPORT
    mismatch = outcome(HEALTHY, mismatches=["disable_radix_cache: requested False, resolved True"])
    verdict = judge(mismatch, 0.85, GATE, Stage(alpha=0.01))
    assert verdict.status is Status.MISMATCH and "disable_radix_cache" in verdict.reason


def test_strict_extraction_is_used_when_configured():
    recs = [r.model_copy(update={"correct_strict": False}) for r in answers(HEALTHY)]
    cell = of_records(recs)
    assert judge(cell, 0.85, GateSpec(extraction="strict"), Stage(alpha=0.01)).status is Status.FAIL


def test_wilson_and_paired_statistics():
    low, high = wilson_interval(180, 200)
    assert 0.85 < low < 0.86 and 0.93 < high < 0.94
    paired = paired_comparison({0: True, 1: False, 2: True}, {0: True, 1: True, 2: False})
    assert (paired.losses, paired.gains, paired.n) == (1, 1, 3) and paired.p_drop == 0.75
    assert paired_comparison({0: True}, {1: True}) is None


def test_history_pairing_catches_a_drop_that_the_reference_shares():
    """Everything broke together: the reference cannot see it, the cell's last run can."""
    yesterday = outcome([True] * 190 + [False] * 10)  # 0.95
    today = outcome([True] * 165 + [False] * 35)  # 0.825, and the reference dropped alike
    verdict = judge(today, floor=0.5, gate=GATE, stage=NIGHT, reference=today, history=yesterday)
    assert verdict.status is Status.FAIL and verdict.history_p < 1e-5
    assert "vs its last runs 0.950" in verdict.reason and "lost 25, gained 0" in verdict.reason


# ---- the audit's holes (issue 15): a broken or missing reference never vouches for a cell ----------
FIVE_POINTS_DOWN = [i % 20 not in (0, 1, 2) for i in range(200)]  # 0.85: 5 points under 0.90


def test_a_cell_whose_reference_errored_is_not_a_pass():
    verdict = judge(outcome(FIVE_POINTS_DOWN), 0.5, GATE, NIGHT, reference=None,
                    reference_problem="reference unavailable: m.ab-triton (server exited with code 1)")
    assert verdict.status is Status.INCONCLUSIVE and "reference unavailable" in verdict.reason


def test_a_reference_that_stopped_early_shares_too_few_questions_to_vouch():
    stopped = outcome([True] * 20)  # 20 answers, all right, then stopped
    verdict = judge(outcome(FIVE_POINTS_DOWN), 0.5, GATE, NIGHT, reference=stopped)
    assert verdict.status is Status.INCONCLUSIVE and "only 20 questions shared of the cell's 200" in verdict.reason


def test_a_drop_against_history_that_is_not_significant_is_inconclusive_like_one_against_the_reference():
    history = outcome(HEALTHY)
    drop = list(HEALTHY)
    for i in range(1, 9):  # 8 losses, 0 gains on 200: a 4-point drop, not significant at alpha/32
        drop[i] = False
    verdict = judge(outcome(drop), 0.5, GATE, NIGHT, history=history)
    assert verdict.history_p is not None and verdict.history_p > NIGHT.alpha
    assert verdict.status is Status.INCONCLUSIVE


def test_alpha_is_split_over_the_tests_actually_made():
    """Floor only: the whole per-cell share. Floor, reference and history: a third of it each."""
    borderline = [i % 100 >= 22 for i in range(200)]  # 0.78 against a floor of 0.85
    alone = judge(outcome(borderline), 0.85, GATE, Stage(alpha=0.01))
    assert alone.status is Status.FAIL and "< 0.01" in alone.reason
    three = judge(outcome(borderline), 0.85, GATE, Stage(alpha=0.01), reference=outcome(borderline), history=outcome(borderline))
    assert three.floor_p == alone.floor_p and 0.01 / 3 < three.floor_p < 0.01
    assert three.status is Status.INCONCLUSIVE  # the same evidence, weighed against a third of the alpha


# ---- one budget, margins and two stages (issue 15) --------------------------------------------------
def cell_of(recs: list[QuestionRecord], **kwargs) -> CellOutcome:
    return of_records(recs, **kwargs)


def pair(n: int, losses: int, gains: int, base: float = 0.9) -> tuple[CellOutcome, CellOutcome]:
    """(cell, reference) on n questions: the reference right on `base` of them; the cell loses
    `losses` of the reference's right answers and gains `gains` of its wrong ones."""
    right = int(n * base)
    reference = [i < right for i in range(n)]
    cell = list(reference)
    for i in range(losses):
        cell[i] = False
    for i in range(gains):
        cell[right + i] = True
    return cell_of(answers(cell)), cell_of(answers(reference))


def test_the_budget_spends_alpha_once_across_cells_looks_and_stages():
    budget = Budget(alpha=0.01, cells=72, early_stop_share=0.1, extension_share=0.7)
    assert abs(budget.early_stop + budget.stage(1) + budget.stage(2) - 0.01 / 72) < 1e-15
    assert abs(budget.stage(2) / budget.stage(1) - 0.7 / 0.3) < 1e-9
    alone = Budget(alpha=0.01, cells=72, early_stop_share=0.1)  # no extension: stage 1 gets it all
    assert alone.stage(2) == 0 and abs(alone.stage(1) - 0.9 * 0.01 / 72) < 1e-15
    assert "72 cells" in budget.describe() and "1 later stage" in budget.describe()
    # Relaunches add stages after the extension: the later share is split evenly over them.
    ladder = Budget(alpha=0.01, cells=72, early_stop_share=0.1, extension_share=0.7, later_stages=3)
    assert ladder.stages == 4 and ladder.stage(5) == 0
    assert abs(ladder.early_stop + sum(ladder.stage(k) for k in range(1, 5)) - 0.01 / 72) < 1e-15
    assert abs(ladder.stage(2) - ladder.stage(4)) < 1e-18 and abs(ladder.stage(2) * 3 / ladder.stage(1) - 0.7 / 0.3) < 1e-9


def test_the_margin_test_reduces_to_mcnemar_and_demands_more_as_the_margin_grows():
    assert drop_above_margin_p(30, 10, 1319, 0.0) == paired_comparison(*[
        {i: ok for i, ok in enumerate(side)} for side in ([False] * 30 + [True] * 10, [True] * 30 + [False] * 10)
    ]).p_drop
    p = [drop_above_margin_p(60, 20, 1319, margin) for margin in (0.0, 0.005, 0.01, 0.02, 0.04)]
    assert p == sorted(p) and p[0] < 1e-5 and p[-1] > 0.5  # 40 net losses = 3.0 points: none beyond 4


def test_a_harmless_offset_is_tolerated_against_the_reference_and_history_within_their_margins():
    """2.3 points down on 2,638 questions: a real, harmless backend offset against another
    configuration (tolerance 2.5 points), or a new build's shift since the cell's last run
    (history_margin); with no margin for history, the same drop there is a change."""
    cell, reference = pair(2638, losses=100, gains=40)  # 60 net losses: 2.3 points
    gate = GateSpec(tolerance=0.025, min_effect=0.03)
    stage = Stage(alpha=Budget(0.01, 72).stage(1))
    against_reference = judge(cell, 0.5, gate, stage, reference=reference)
    assert against_reference.status is not Status.FAIL and against_reference.mcnemar_p > 0.5
    assert judge(cell, 0.5, gate, stage, history=reference).history_p > 0.5  # history_margin: the tolerance
    strict = gate.model_copy(update={"history_margin": 0.0})
    against_history = judge(cell, 0.5, strict, stage, history=reference)
    assert against_history.history_p < 1e-4 and against_history.history_p < stage.alpha
    assert against_history.status is Status.FAIL


def test_a_pass_needs_every_drop_bounded_under_min_effect_at_every_stage():
    cell, reference = pair(200, losses=6, gains=4)  # 1 point down on 200: could still hide 3
    for stage in (Stage(alpha=Budget(0.01, 32, extension_share=0.7).stage(1)), NIGHT):
        undecided = judge(cell, 0.5, GATE, stage, reference=reference)
        assert undecided.status is Status.INCONCLUSIVE and "drop 1.0 pts (95.0% bound 4.0)" in undecided.reason
        assert "not under min_effect 3 pts" in undecided.reason
    big_cell, big_reference = pair(1319, losses=30, gains=20)  # about the same on 1,319
    passed = judge(big_cell, 0.5, GATE, NIGHT, reference=big_reference)
    assert passed.status is Status.PASS and "drop 0.8 pts (95.0% bound 1.7)" in passed.reason
    # The audit's example: lost 60, gained 22 of 1,319: drop 2.9 pts, its bound 4.0: never a pass.
    audit_cell, audit_reference = pair(1319, losses=60, gains=22)
    assert judge(audit_cell, 0.5, GATE, NIGHT, reference=audit_reference).status is Status.INCONCLUSIVE


def test_a_launch_spread_widens_the_bound_and_weakens_the_test():
    cell, reference = pair(1319, losses=50, gains=20)
    plain = judge(cell, 0.5, GATE, NIGHT, reference=reference)
    spread = judge(cell, 0.5, GATE, NIGHT, reference=reference, launch_sd=0.005)
    assert spread.mcnemar_p > plain.mcnemar_p
    bound = [float(v.reason.split("bound ")[1].split(")")[0]) for v in (plain, spread)]
    assert bound[1] > bound[0]


def test_the_floor_is_tested_on_test_questions_only():
    test_part = answers([i % 10 != 0 for i in range(200)])  # 0.90 on the test split
    train_part = answers([i % 2 == 0 for i in range(400)], start=EXTENSION_INDEX_OFFSET)  # 0.50 on train
    verdict = judge(cell_of(test_part + train_part), 0.85, GATE, NIGHT)
    assert verdict.status is Status.PASS and verdict.n == 600 and "on 200 test questions" not in verdict.reason
    assert verdict.floor_p is not None and verdict.floor_p > 0.5


def test_at_stage_two_the_same_floor_evidence_is_not_tested_again():
    """Under the floor but not significantly on the planned questions, and the extension added only
    train questions: the floor stays undecided, and it cannot turn into a fail for free."""
    near = answers([i % 100 >= 16 for i in range(1319)])  # 0.84 against 0.85
    more = answers([True] * 1319, start=EXTENSION_INDEX_OFFSET)
    stage_two = Stage(alpha=1.0, floor_tested=False)  # even an absurd alpha spends nothing on it
    verdict = judge(cell_of(near + more), 0.85, GATE, stage_two)
    assert verdict.status is Status.INCONCLUSIVE and "not significantly" in verdict.reason


def test_a_cell_the_sequential_test_stopped_is_a_fail():
    stopped = cell_of(answers([True] * 12 + [False] * 8), stopped_early="stopped early after the first 20 ...")
    verdict = judge(stopped, 0.5, GATE, NIGHT)  # 0.60 is above this floor: only the early stop says fail
    assert verdict.status is Status.FAIL and "stopped early" in verdict.reason


def test_the_pinned_run_is_one_more_test_and_catches_a_slow_drift():
    today, pinned = pair(2638, losses=140, gains=40)  # 3.8 points below a pinned good night
    yesterday = cell_of(today.questions)  # last night drifted just as far: no change since then
    verdict = judge(today, 0.5, GATE, Stage(alpha=Budget(0.01, 72).stage(1)), history=yesterday, pinned=pinned)
    assert verdict.history_p > 0.99 and verdict.pinned_p < 1e-6 and verdict.status is Status.FAIL
    assert "vs the pinned run" in verdict.reason


def _size(n: int, loss_rate: float, gain_rate: float, margin: float, alpha: float, p_value) -> float:
    """The exact chance that `p_value(losses, gains)` < alpha when the truth is these rates."""
    from scipy.stats import binom

    total = 0.0
    for gains in range(0, 12):
        for losses in range(0, 60):
            mass = binom.pmf(gains, n, gain_rate) * binom.pmf(losses, n - gains, loss_rate / (1 - gain_rate))
            if mass > 1e-13 and p_value(losses, gains) < alpha:
                total += mass
    return total


def test_the_margin_test_holds_its_size_where_the_score_test_does_not():
    """Least favourable: a cell exactly 1.5 points down (the margin) with almost no gains, 1,319
    questions, a cell's alpha of a 72-cell run. Tango's normal tail rejects ~7x too often here;
    the exact tail keeps its size."""
    from scipy.stats import norm

    from harness.gate.stats import _tango_z

    n, margin, alpha = 1319, 0.015, 1e-5
    gain_rate = 0.0015
    exact = _size(n, gain_rate + margin, gain_rate, margin, alpha,
                  lambda losses, gains: drop_above_margin_p(losses, gains, n, margin))
    score = _size(n, gain_rate + margin, gain_rate, margin, alpha,
                  lambda losses, gains: float(norm.sf(_tango_z(float(losses), float(gains), n, margin))))
    assert exact <= alpha < score / 3


def test_the_wilson_interval_is_scipys_without_importing_scipy():
    from scipy.stats import binomtest

    for correct, n in ((0, 1), (3, 20), (180, 200), (1319, 1319), (1187, 1319)):
        ours, theirs = wilson_interval(correct, n), binomtest(correct, n).proportion_ci(method="wilson")
        assert abs(ours[0] - theirs.low) < 1e-12 and abs(ours[1] - theirs.high) < 1e-12
