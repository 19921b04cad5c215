"""Protocols: selection, prompt format, fingerprints."""

from __future__ import annotations

import json

import pytest

from harness.benchmark.gsm8k.protocol import EXTENSION_INDEX_OFFSET, SGLANG_STOP, build_plan, extension_plan
from harness.errors import ConfigError


def test_sglang_fewshot_prompt_for_question_0_is_byte_exact(gsm8k, _gsm8k_env):
    lines = [json.loads(line) for line in (_gsm8k_env / "test.jsonl").read_text().splitlines()[:5]]
    expected = "".join("Question: " + row["question"] + "\nAnswer: " + row["answer"] + "\n\n" for row in lines)
    expected += "Question: " + lines[0]["question"] + "\nAnswer:"
    plan = build_plan(gsm8k, "sglang-fewshot", 200, 0)
    assert plan.prompts[0].text == expected
    assert [p.index for p in plan.prompts[:3]] == [0, 1, 2]  # from index 0, shots included
    assert plan.stop == SGLANG_STOP and plan.endpoint == "generate" and plan.max_tokens == 512
    assert plan.temperature == 0.0


def test_clean_shots_come_from_train_and_questions_are_a_seeded_subset(gsm8k):
    plan = build_plan(gsm8k, "clean", 200, 0)
    indices = [p.index for p in plan.prompts]
    assert indices != list(range(200)) and len(set(indices)) == 200
    assert indices == [p.index for p in build_plan(gsm8k, "clean", 200, 0).prompts]
    assert indices != [p.index for p in build_plan(gsm8k, "clean", 200, 1).prompts]
    text = plan.prompts[0].text
    assert text.count("Question:") == 6 and text.endswith("\nAnswer:")
    assert "<<" not in text.rsplit("Question:", 1)[0]  # calculator annotations removed from shots
    for shot in plan.shot_indices:
        assert gsm8k.train[shot].question in text


def test_clean_all_questions_when_none(gsm8k):
    assert len(build_plan(gsm8k, "clean", None, 0).prompts) == len(gsm8k.test) == 1319


def test_chat_uses_messages(gsm8k):
    plan = build_plan(gsm8k, "chat", 10, 0)
    assert plan.endpoint == "chat" and plan.prompts[0].text is None
    assert len(plan.prompts[0].messages) == 11 and plan.prompts[0].messages[-1][0] == "user"


def test_fingerprint_changes_with_what_matters(gsm8k):
    base = build_plan(gsm8k, "clean", 50, 0).fingerprint
    assert base == build_plan(gsm8k, "clean", 50, 0).fingerprint
    assert base != build_plan(gsm8k, "clean", 50, 1).fingerprint
    assert base != build_plan(gsm8k, "clean", 51, 0).fingerprint
    assert base != build_plan(gsm8k, "clean", 50, 0, max_tokens=256).fingerprint
    assert base != build_plan(gsm8k, "chat", 50, 0).fingerprint


def test_too_many_questions_is_a_config_error(gsm8k):
    with pytest.raises(ConfigError, match="all 1319 test questions, then train questions"):
        build_plan(gsm8k, "clean", 50_000, 0)
    with pytest.raises(ConfigError, match="test questions only"):
        build_plan(gsm8k, "sglang-fewshot", 2000, 0)


def test_past_the_test_split_a_clean_plan_takes_train_questions_never_the_shots(gsm8k):
    plan = build_plan(gsm8k, "clean", 2638, 0)
    test = [p.index for p in plan.prompts if p.index < EXTENSION_INDEX_OFFSET]
    train = [p.index - EXTENSION_INDEX_OFFSET for p in plan.prompts if p.index >= EXTENSION_INDEX_OFFSET]
    assert len(plan.prompts) == 2638 and sorted(test) == list(range(1319)) and len(set(train)) == 1319
    assert not set(train) & set(plan.shot_indices)
    assert [p.index for p in plan.prompts[:1319]] == [p.index for p in build_plan(gsm8k, "clean", None, 0).prompts]
    more = extension_plan(gsm8k, build_plan(gsm8k, "clean", 200, 0), 2438)  # the same questions, extended
    assert [p.index for p in more.prompts] == [p.index for p in plan.prompts[200:]]


def test_run_eval_prompts_are_byte_identical_to_gsm8keval(gsm8k):
    """sglang's run_eval GSM8KEval, from its construction rules: each of the first five test lines
    as `Question: q\\nAnswer: a` followed by a blank line, then `Question: q\\nAnswer:` for the test
    lines after them, in file order."""
    plan = build_plan(gsm8k, "sglang-run-eval", 50, seed=123)
    shots = "".join(f"Question: {p.question}\nAnswer: {p.solution}\n\n" for p in gsm8k.test[:5])
    assert [p.index for p in plan.prompts] == list(range(5, 55))  # never the shots, never shuffled
    for prompt in plan.prompts[:3] + plan.prompts[-1:]:
        problem = gsm8k.test[prompt.index]
        assert prompt.text == shots + f"Question: {problem.question}\nAnswer:"
    assert plan.endpoint == "completions" and plan.stop == SGLANG_STOP and plan.temperature == 0.0
    assert build_plan(gsm8k, "sglang-run-eval", None, 0).prompts[-1].index == len(gsm8k.test) - 1


@pytest.mark.parametrize(("output", "value"), [
    ("so 3 + 4 = 7\n#### 7\n\nQuestion: next\n#### 99", "7"),  # the first marker: the question asked
    ("he pays $1,945,400 in all", "1945400"), ("-5 degrees", "-5"), ("#### 3.50", "3.5"),
    ("The answer is 18.", "18"), ("agent 007", None), ("no number", None)])
def test_run_eval_extraction_keeps_signs_and_decimals(output, value):
    from harness.benchmark.gsm8k.extract import extract_sglang_run_eval

    assert extract_sglang_run_eval(output) == value


def test_run_eval_grades_numbers_not_strings(gsm8k):
    plan = build_plan(gsm8k, "sglang-run-eval", 5, 0)
    gold = plan.prompts[0].gold
    assert plan.grade(f"#### {gold}.00", gold).correct and not plan.grade("#### -1", gold).correct


def test_mixed_prefix_prompts_share_partial_prefixes_of_many_lengths(gsm8k):
    plan = build_plan(gsm8k, "mixed-prefix", 200, 0)
    clean = build_plan(gsm8k, "clean", 200, 0)
    assert [p.index for p in plan.prompts] == [p.index for p in clean.prompts]  # the clean questions
    assert plan.shot_indices[:5] == clean.shot_indices and len(plan.shot_indices) == 15
    prefixes = [p.text.rpartition("Question: ")[0] for p in plan.prompts]
    shots = [p.text.count("Question: ") - 1 for p in plan.prompts]
    assert set(shots) == set(range(0, 9))  # 0-5 shots and 0-3 more examples: every length from 0 to 8
    assert len(set(prefixes)) > 100  # almost every full prefix is its own
    first_shot = clean.prompts[0].text.split("\n\n")[0]
    assert sum(prefix.startswith(first_shot) for prefix in prefixes) > 100  # yet most share the first shot
    assert all(p.teacher and p.teacher.startswith(" ") for p in plan.prompts)
    asked = {p.index for p in plan.prompts}
    train_questions = [p for p in build_plan(gsm8k, "mixed-prefix", 1319 + 50, 0).prompts if p.split == "train"]
    assert not {p.index - 100_000 for p in train_questions} & set(plan.shot_indices)  # never a shot or a tail
    (extra,) = extension_plan(gsm8k, plan, 1).prompts
    assert extra.index not in asked and extra.text.endswith("\nAnswer:")
    assert build_plan(gsm8k, "mixed-prefix", 200, 0).prompts == plan.prompts  # deterministic
