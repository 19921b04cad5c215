"""The decode self-check's verdict (harness.gate.self_checks): what a cell's own decode-against-prefill
records say, what is "not measured", and that it never leans on a reference."""

from __future__ import annotations

from harness.gate.self_checks import self_checks
from harness.records import DecodeCheck, QuestionRecord, SelfChecks, TeacherForced

TEACHER = TeacherForced(start=5, token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3], top_ids=[1, 2, 3])


def record(index: int, decode: DecodeCheck) -> QuestionRecord:
    return QuestionRecord(index=index, prompt_sha="", gold="1", pred="1", correct=True, finish_reason="stop", output="1",
                          latency_s=0.0, output_tokens=1, teacher=TEACHER, checks=SelfChecks(decode=decode))


def decoded(follow_shift: float, answer_shift: float = 0.0, cached: int = 40) -> DecodeCheck:
    prefilled = [-0.5] * 8
    return DecodeCheck(prompt_tokens=30, token_ids=list(range(8)), prefilled=prefilled, follow_start=6,
                       follow_cached=cached, decoded=[v + answer_shift for v in prefilled[:6]] +
                       [v + follow_shift for v in prefilled[6:]])


def decode_of(records: list[QuestionRecord]):
    made, unmeasured = self_checks(records, tolerance=0.1, healthy_share=0.1, margin=0.02)
    return next((check for check in made if check.name == "decode"), None), unmeasured


def test_a_healthy_cell_agrees_with_its_own_prefill():
    check, unmeasured = decode_of([record(i, decoded(0.01)) for i in range(20)])
    assert check.beyond == 0 and check.p == 1.0 and check.n == 20
    assert not [line for line in unmeasured if "decode" in line]
    assert "20 follow-ups read their answer's decoded KV from the cache" in check.detail


def test_a_follow_up_that_reads_decoded_rows_wrong_fails_and_says_which_part_moved():
    check, _ = decode_of([record(i, decoded(0.9)) for i in range(20)])
    assert check.beyond == 20 and check.p < 1e-15
    assert "answer worst 0, follow-up worst 0.9;" in check.detail
    # the answer part alone counts as well (a decode kernel that disagrees with the prefill)
    answer, _ = decode_of([record(i, decoded(0.0, answer_shift=0.5, cached=0)) for i in range(20)])
    assert answer.beyond == 20 and "0 follow-ups read" in answer.detail


def test_a_server_that_cannot_answer_it_is_not_measured_never_passed():
    check, unmeasured = decode_of([record(i, DecodeCheck(error="answer: HTTP 400: input_ids unsupported")) for i in range(8)])
    assert check is None
    assert "self-check decode not measured (answer: HTTP 400: input_ids unsupported)" in unmeasured
