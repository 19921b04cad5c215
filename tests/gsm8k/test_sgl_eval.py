"""Protocol `sgl-eval`: the prompts and the grading of sgl-eval's GSM8K (what sglang's CI scores with)."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness.benchmark.gsm8k.protocol import build_plan, grade_sgl_eval, last_boxed
from tests.helpers import ROOT, machine_s

SGLANG_PYTHON = ROOT / ".sglang-0.5.23" / "bin" / "python"
# Answers a model gives, and how each must grade against the expected answer.
CASES = [("So she earns \\boxed{18} dollars.", "18", True), ("\\boxed{18.0}", "18", True),
         ("\\boxed{\\$18}", "18", True), ("\\boxed{17}", "18", False), ("The answer is 18.", "18", False),
         ("\\boxed{1,000}", "1000", True), ("\\boxed{\\frac{1}{2}}", "0.5", True), ("\\boxed{3} then \\boxed{5}", "5", True),
         ("\\boxed{-3}", "-3", True), ("\\boxed{18%}", "18", True), ("\\boxed{x}", "18", False)]


def test_the_plan_asks_the_test_split_in_file_order_zero_shot_in_one_user_turn(gsm8k):
    plan = build_plan(gsm8k, "sgl-eval", 10, 0)
    assert plan.endpoint == "chat" and [p.index for p in plan.prompts] == list(range(10)) and plan.temperature == 0
    (turn,) = plan.prompts[0].messages
    assert turn[0] == "user" and turn[1] == ("Solve the following math problem. Make sure to put the answer (and only "
                                             "answer) inside \\boxed{}.\n\n" + gsm8k.test[0].question)
    assert plan.prompts[0].gold == "18" and plan.prompts[0].teacher is None and not plan.extensible


@pytest.mark.parametrize(("output", "gold", "correct"), CASES)
def test_the_last_boxed_answer_is_graded_by_value(output, gold, correct):
    assert grade_sgl_eval(output, gold).correct is correct


def test_boxed_content_keeps_its_braces():
    assert last_boxed("\\boxed{\\frac{3}{4}} and more") == "\\frac{3}{4}"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None


@pytest.mark.sglang
def test_prompts_and_grades_match_sgl_evals_own_code(gsm8k):
    """sgl-eval 0.1.3 itself (installed in the sglang environment, `make sglang-env`): its prompt
    renderer and NeMo-Skills' math grader against ours, on the first 50 questions and the cases above."""
    assert SGLANG_PYTHON.exists(), "the pinned sglang is missing: `make sglang-env` installs it (make test does)"
    plan = build_plan(gsm8k, "sgl-eval", 50, 0)
    script = """
import importlib.util, json, sys
from pathlib import Path
import sgl_eval
from sgl_eval._vendored.nemo_skills.math_grader import extract_answer, math_equal
spec = importlib.util.spec_from_file_location("prompts", Path(sgl_eval.__file__).parent / "evals" / "_prompts.py")
prompts = importlib.util.module_from_spec(spec); spec.loader.exec_module(prompts)
task = json.load(sys.stdin)
rendered = [prompts.render_prompt(prompts.vendored_prompt("math"), problem) for problem in task["problems"]]
graded = [bool(math_equal(gold, extract_answer(output))) for output, gold in task["cases"]]
print(json.dumps({"prompts": rendered, "graded": graded}))
"""
    task = {"problems": [gsm8k.test[p.index].question for p in plan.prompts], "cases": [[o, g] for o, g, _ in CASES]}
    done = subprocess.run([str(SGLANG_PYTHON), "-c", script], input=json.dumps(task), capture_output=True, text=True,
                          timeout=machine_s(120), check=True)
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [p.messages[0][1] for p in plan.prompts] == theirs["prompts"]  # byte for byte
    assert [grade_sgl_eval(o, g).correct for o, g, _ in CASES] == theirs["graded"]
