"""The teacher-forced divergence test against the reference (harness.gate.divergence) and how it
joins the other tests of a verdict."""

from __future__ import annotations

import pytest

from harness.gate.divergence import DivergenceLooks, DivergenceStop, divergence_test, question_divergence
from harness.gate.verdict import Stage, judge
from harness.records import Status, TeacherForced
from harness.suite.config import DivergenceSpec, GateSpec
from tests.records import answers, outcome

TOKENS = list(range(40))


def teacher(shift: float = 0.0, flips: int = 0, tokens: list[int] | None = None, **fields) -> TeacherForced:
    ids = tokens or TOKENS
    return TeacherForced(start=100, token_ids=ids, logprobs=[-1.0 - shift] * len(ids),
                         top_ids=[-1] * flips + ids[flips:], **fields)


def with_teachers(pattern: list[bool], shifts: list[float]) -> list:
    return [record.model_copy(update={"teacher": teacher(shift)}) for record, shift in zip(answers(pattern), shifts, strict=True)]


def test_a_question_diverges_by_its_mean_absolute_difference_per_token():
    value, flips, positions = question_divergence(teacher(0.3, flips=4), teacher())
    assert value == pytest.approx(0.3) and (flips, positions) == (4, 40)
    assert question_divergence(teacher(), teacher(tokens=list(range(1, 41)))) is None  # tokenized otherwise
    assert question_divergence(teacher(error="HTTP 404: Not Found"), teacher()) is None


def test_healthy_numerics_pass_and_a_broken_prefix_cache_fails():
    reference = with_teachers([True] * 30, [0.0] * 30)
    healthy = with_teachers([True] * 30, [0.01] * 27 + [0.5] * 3)  # 3 of 30 beyond: a healthy share
    broken = with_teachers([True] * 30, [0.8] * 30)
    calm = divergence_test(healthy, reference, 0.1, 0.1)
    assert calm.n == 30 and calm.beyond == 3 and calm.p > 0.5
    wild = divergence_test(broken, reference, 0.1, 0.1)
    assert wild.beyond == 30 and wild.p < 1e-20 and wild.nats == pytest.approx(0.8)
    assert "30 of 30 questions beyond 0.1 nats/token" in wild.describe(1e-4) and "< 0.0001" in wild.describe(1e-4)
    assert divergence_test(answers([True] * 5), reference, 0.1, 0.1) is None  # no teacher records: no test


def test_questions_one_side_cannot_compare_are_counted_not_tested():
    reference = with_teachers([True] * 10, [0.0] * 10)
    cell = with_teachers([True] * 10, [0.0] * 10)
    cell[0] = cell[0].model_copy(update={"teacher": teacher(tokens=list(range(5, 45)))})
    found = divergence_test(cell, reference, 0.1, 0.1)
    assert found.n == 9 and found.unpaired == 1 and "1 not comparable" in found.describe()


GATE = GateSpec(alpha=0.01, extend_to=None, tolerance=0.1, min_effect=0.3)  # 40 questions: a bound they can meet


def test_a_cell_whose_answers_agree_but_whose_tokens_diverge_fails_on_divergence():
    """Same accuracy as the reference (the bug changed no final answer): only divergence sees it."""
    reference = outcome(with_teachers([True] * 40, [0.0] * 40))
    cell = outcome(with_teachers([True] * 40, [0.6] * 40))
    verdict = judge(cell, 0.8, GATE, Stage(alpha=1e-3), reference=reference)
    assert verdict.status is Status.FAIL and verdict.accuracy == 1.0
    assert "divergence vs reference: 40 of 40 questions beyond" in verdict.reason
    assert verdict.divergence_share == 1.0 and verdict.divergence_p < 1e-30 and verdict.divergence_n == 40
    healthy = judge(outcome(with_teachers([True] * 40, [0.01] * 40)), 0.8, GATE, Stage(alpha=1e-3), reference=reference)
    assert healthy.status is Status.PASS and healthy.divergence_p == 1.0
    assert "divergence vs reference: 0 of 40 questions beyond" in healthy.reason


def test_the_models_tolerance_replaces_the_gates_and_the_test_can_be_turned_off():
    reference = outcome(with_teachers([True] * 40, [0.0] * 40))
    cell = outcome(with_teachers([True] * 40, [0.03] * 40))
    assert judge(cell, 0.8, GATE, Stage(alpha=1e-3), reference=reference).status is Status.PASS  # 0.03 < 0.1
    tight = judge(cell, 0.8, GATE, Stage(alpha=1e-3), reference=reference, divergence_tolerance=0.005)
    assert tight.status is Status.FAIL and "beyond 0.005 nats/token" in tight.reason
    off = GATE.model_copy(update={"divergence": DivergenceSpec(enabled=False)})
    untested = judge(cell, 0.8, off, Stage(alpha=1e-3), reference=reference, divergence_tolerance=0.005)
    assert untested.status is Status.PASS and untested.divergence_p is None and "divergence" not in untested.reason


def test_the_divergence_test_takes_its_share_of_the_stages_alpha():
    """One more test splits the stage's alpha one more way: the floor test's level halves."""
    records = with_teachers([True] * 36 + [False] * 4, [0.0] * 40)
    with_reference = judge(outcome(records), 0.8, GATE, Stage(alpha=1e-3), reference=outcome(records))
    assert "p(drop > 10 pts)" in with_reference.reason and "divergence vs reference" in with_reference.reason
    assert with_reference.status is Status.PASS
    # floor, paired accuracy, divergence: alpha 1e-3 over three tests
    assert judge(outcome(with_teachers([False] * 40, [0.0] * 40)), 0.8, GATE, Stage(alpha=1e-3),
                 reference=outcome(records)).reason.count("< 0.00033") >= 1


def stop_rule(reference: list, total: int = 200) -> DivergenceStop:
    return DivergenceStop(reference=tuple(((r.split, r.index), r.teacher) for r in reference),
                          order=tuple(("test", i) for i in range(total)), tolerance=0.1, healthy_share=0.1, alpha=1e-5)


def test_the_divergence_looks_stop_a_diverged_cell_at_the_first_look_and_never_a_healthy_one():
    reference = with_teachers([True] * 200, [0.0] * 200)
    rule = stop_rule(reference)
    assert [n for n, _ in rule.critical] == [20, 40, 80, 160]
    looks = DivergenceLooks(rule)
    reasons = [looks.add(r) for r in reversed(with_teachers([True] * 200, [0.5] * 200)[:20])]
    assert reasons[:-1] == [None] * 19  # back out of order: the look waits for the first 20 of the seeded order
    assert reasons[-1].startswith("stopped early after the first 20 comparable questions of the seeded order")
    healthy = DivergenceLooks(rule)
    assert not any(healthy.add(r) for r in with_teachers([True] * 200, [0.01] * 180 + [0.5] * 20))


def test_the_divergence_looks_pass_over_questions_they_cannot_compare():
    reference = with_teachers([True] * 40, [0.0] * 40)
    looks = DivergenceLooks(stop_rule(reference, total=40))
    cell = with_teachers([True] * 40, [0.5] * 40)
    cell[3] = cell[3].model_copy(update={"teacher": TeacherForced(error="HTTP 404")})
    reasons = [looks.add(r) for r in cell[:21]]
    assert reasons[:20] == [None] * 20 and reasons[20] is not None  # 20 comparable only after 21 back


def test_a_reference_that_cannot_vouch_is_not_diverged_from():
    """Every healthy cell diverges from a broken reference: the test is not made, the cell is held open."""
    reference = outcome(with_teachers([True] * 40, [0.9] * 40))
    cell = outcome(with_teachers([True] * 40, [0.0] * 40))
    verdict = judge(cell, 0.8, GATE, Stage(alpha=1e-3), reference=reference,
                    reference_problem="reference broken: m.ref is fail")
    assert verdict.status is Status.INCONCLUSIVE and verdict.divergence_p is None
    assert "divergence" not in verdict.reason
