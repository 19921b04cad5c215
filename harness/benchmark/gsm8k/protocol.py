"""Evaluation protocols: which questions, which shots, how a prompt looks and how it is scored.

- `clean` (default): 5 shots drawn (seeded) from the *train* split, questions from the test split,
  either all 1,319 or a seeded random subset, never "the first N"; `/v1/completions`.
- `sglang-fewshot`: exactly sglang's `few_shot_gsm8k` test (shots = first 5 *test* lines, questions
  from index 0, native `/generate`, sglang's stop list and integer extraction), for comparability
  with thresholds written for sglang's CI. Its flaws are kept on purpose: the 5 shots are also
  scored as questions, and negatives and decimals are lost by its extraction.
- `sglang-run-eval`: sglang's `run_eval` GSM8KEval, which sglang's CI thresholds now come from (Kimi-
  Linear > 0.88): shots = the first 5 test lines, questions = the test lines after them in order,
  `/v1/completions` with sglang's stop list, and its extraction (the number after the first `####`,
  else the last number; signs and decimals kept, compared as numbers).
- `chat`: the clean questions and shots as chat turns through `/v1/chat/completions`.
- `mixed-prefix`: the clean questions, each after its own prefix: the first k of the 5 clean shots
  (k drawn per question, 0-5) and then m of 10 more train examples (m drawn, 0-3, in a drawn
  order). Questions that drew k1 <= k2 share the first k1 shots, so a radix cache is hit at many
  depths and branches there, and each full prefix is almost always unique, as sglang's
  `MixedPrefixGSM8KEval` does for its radix tests (its own draws, not its prompts). For radix cells.
- `sgl-eval`: sgl-eval's GSM8K (PyPI `sgl-eval` 0.1.3, what sglang's CI scores with now): zero-shot,
  one user turn of NeMo-Skills' `generic/math` prompt ("Solve the following math problem. Make sure
  to put the answer (and only answer) inside \\boxed{}." then the problem), the test split in file
  order, greedy through `/v1/chat/completions`; graded as its MathEvaluator does: the last `\\boxed{}`
  of the answer against the expected answer (the number after `####`, commas removed, an integer
  when integral), equal when their normalized strings are, else when math_verify says so.

Each prompt but chat's and sgl-eval's carries its teacher text (the question's reference solution,
in the shots' format) for the teacher-forced divergence test (harness.gate.divergence).

Every plan carries a fingerprint: results with different fingerprints are not comparable.
"""

from __future__ import annotations

import random
import re
from enum import Enum

from harness.benchmark.base import Endpoint, Grade, Prompt, ProtocolPlan, fingerprinted
from harness.benchmark.gsm8k.dataset import Gsm8k, Problem
from harness.benchmark.gsm8k.extract import (
    extract_flexible,
    extract_sglang_integer,
    extract_sglang_run_eval,
    extract_strict,
)
from harness.errors import ConfigError


class ProtocolName(str, Enum):
    """The evaluation protocols (see the module docstring)."""

    CLEAN = "clean"
    SGLANG_FEWSHOT = "sglang-fewshot"
    SGLANG_RUN_EVAL = "sglang-run-eval"
    CHAT = "chat"
    MIXED_PREFIX = "mixed-prefix"
    SGL_EVAL = "sgl-eval"

    def __str__(self) -> str:
        return self.value


NUM_SHOTS = 5
CLEAN_STOP = ("Question:", "</s>", "<|im_end|>")
SGLANG_STOP = ("Question", "Assistant:", "<|separator|>")
_CALCULATOR_ANNOTATION = re.compile(r"<<[^>]*>>")
TRAIN_SPLIT = "train"


def grade_flexible(output: str, gold: str) -> Grade:
    """clean and chat: the flexible extraction gates (or the strict one, `gate.extraction`)."""
    flexible, strict = extract_flexible(output), extract_strict(output)
    return Grade(flexible, flexible == gold, strict, strict == gold)


def grade_sglang_integer(output: str, gold: str) -> Grade:
    """sglang-fewshot: sglang's own integer extraction."""
    pred = extract_sglang_integer(output)
    return Grade(pred, pred == gold, pred, pred == gold)


SGL_EVAL_PROMPT = ("Solve the following math problem. Make sure to put the answer (and only answer) inside "
                   "\\boxed{{}}.\n\n{problem}")  # NeMo-Skills generic/math, zero-shot (no {examples})


def sgl_eval_expected(solution: str) -> str:
    """NeMo-Skills' GSM8K `expected_answer`: the number after `####`, commas removed, as an integer
    when it is one (its prepare.py also fixes a few *train* answers; the test split has none of them)."""
    value = float(solution.split("####")[1].replace(",", ""))
    return str(int(value)) if value == int(value) else str(value)


def last_boxed(output: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if there is none."""
    start = output.rfind("\\boxed")
    if start < 0:
        start = output.rfind("\\fbox")
    if start < 0:
        return None
    opening = output.find("{", start)
    if opening < 0:
        return None
    depth = 0
    for position in range(opening, len(output)):
        depth += {"{": 1, "}": -1}.get(output[position], 0)
        if depth == 0:
            return output[opening + 1:position]
    return None


_PERCENT = re.compile(r"^(\d+\.?\d*)(?:\\%|%)$")


def grade_sgl_eval(output: str, gold: str) -> Grade:
    """sgl-eval: the last boxed answer, equal to the expected one as normalized strings or by
    math_verify (imported here: it loads sympy, ~1-4 s, and only this protocol needs it). Its
    timeouts are off: they use SIGALRM, which works in a main thread only, and a Ray worker's
    evaluation is not one."""
    pred = last_boxed(output)
    if pred is None:
        return Grade(None, False, None, False)
    value = _PERCENT.sub(r"\1", pred).rstrip(".\\")  # NeMo-Skills drops a number's % and a final "."
    correct = value.replace(" ", "").replace(",", "") == gold
    if not correct:
        from math_verify import parse, verify

        try:
            correct = bool(verify(parse(f"\\boxed{{{gold}}}", parsing_timeout=None),
                                  parse(f"\\boxed{{{value}}}", parsing_timeout=None), timeout_seconds=None))
        except Exception:  # math_verify raises on what it cannot parse: not equal
            correct = False
    return Grade(pred, correct, pred, correct)


def grade_sglang_run_eval(output: str, gold: str) -> Grade:
    """sglang-run-eval: GSM8KEval's extraction (the number after the first `####`, else the last)."""
    pred = extract_sglang_run_eval(output)
    return Grade(pred, pred == gold, pred, pred == gold)


_GRADERS = {ProtocolName.CLEAN: grade_flexible, ProtocolName.CHAT: grade_flexible,
            ProtocolName.MIXED_PREFIX: grade_flexible, ProtocolName.SGL_EVAL: grade_sgl_eval,
            ProtocolName.SGLANG_FEWSHOT: grade_sglang_integer, ProtocolName.SGLANG_RUN_EVAL: grade_sglang_run_eval}
# Their questions are fixed by sglang's tests: no clean extension.
_EXTENSIBLE = {ProtocolName.CLEAN, ProtocolName.CHAT, ProtocolName.MIXED_PREFIX}
MIXED_SECONDARY = 10  # train examples, besides the shots, that mixed-prefix prefixes draw their tails from
MIXED_TAIL = 3  # at most this many of them in one prefix


def clean_solution(solution: str) -> str:
    """A train solution as a shot: calculator annotations `<<48/2=24>>` removed."""
    return _CALCULATOR_ANNOTATION.sub("", solution)


def _question_order(count: int, num_questions: int | None, seed: int) -> list[int]:
    """Test indices in the protocol's seeded order: all of them, or the first `num_questions`."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order if num_questions is None else order[:num_questions]


def _train_pool(data: Gsm8k, shots: tuple[int, ...] | list[int], seed: int) -> list[int]:
    """Train indices that are not shots, in their own seeded order (what comes after the test split)."""
    pool = [i for i in range(len(data.train)) if i not in set(shots)]
    random.Random(seed + 1).shuffle(pool)
    return pool


def _chosen(data: Gsm8k, shots: list[int], num_questions: int | None, seed: int) -> list[tuple[int, Problem]]:
    """(recorded index, problem) of a clean or chat plan: test questions in seeded order and, past the
    test split's size, train questions (recorded as EXTENSION_INDEX_OFFSET + i): the paired tests
    use them, the floor never does."""
    test = [(i, data.test[i]) for i in _question_order(len(data.test), num_questions, seed)]
    wanted = len(test) if num_questions is None else num_questions
    room = len(data.test) + len(data.train) - len(shots)
    if wanted > room:
        raise ConfigError(f"num_questions: {wanted} asked but GSM8K has {room} (all {len(data.test)} test "
                          f"questions, then train questions that are not shots)")
    train = [(EXTENSION_INDEX_OFFSET + i, data.train[i]) for i in _train_pool(data, shots, seed)[:wanted - len(test)]]
    return test + train


def _mixed_prefix(data: Gsm8k, shots: tuple[int, ...] | list[int], seed: int, index: int) -> str:
    """A mixed-prefix question's own prefix: the first k shots, then m secondary examples
    (`shots` holds the NUM_SHOTS shots, then the secondary pool); drawn from the question's index,
    so an extension draws the same way."""
    primary, secondary = list(shots[:NUM_SHOTS]), list(shots[NUM_SHOTS:])
    draw = random.Random(f"{seed}:mixed-prefix:{index}")
    chosen = primary[:draw.randint(0, len(primary))] + draw.sample(secondary, draw.randint(0, MIXED_TAIL))
    return "".join(_clean_example(data.train[i]) for i in chosen)


def _prompt(name: ProtocolName, index: int, problem: Problem, prefix: str,
            turns: tuple[tuple[str, str], ...]) -> Prompt:
    split = TRAIN_SPLIT if index >= EXTENSION_INDEX_OFFSET else "test"
    if name in (ProtocolName.CLEAN, ProtocolName.MIXED_PREFIX):
        return Prompt(index, problem.gold, prefix + f"Question: {problem.question}\nAnswer:", split=split,
                      teacher=" " + clean_solution(problem.solution))
    return Prompt(index, problem.gold, messages=(*turns, ("user", f"Question: {problem.question}")), split=split)


def build_plan(data: Gsm8k, name: str, num_questions: int | None, seed: int, max_tokens: int = 512) -> ProtocolPlan:
    """Build a protocol's prompts. `num_questions=None` asks the whole test split; clean and chat
    take more than the test split has from the train split (never the shots)."""
    try:
        protocol = ProtocolName(name)
    except ValueError:
        raise ConfigError(f"protocol: unknown protocol {name!r}; allowed: "
                          f"{', '.join(p.value for p in ProtocolName)}") from None
    return _BUILDERS[protocol](data, num_questions, seed, max_tokens)


def _test_count(data: Gsm8k, num_questions: int | None, protocol: ProtocolName, order: str) -> int:
    """How many test questions a protocol that asks the test split only takes."""
    count = len(data.test) if num_questions is None else num_questions
    if count > len(data.test):
        raise ConfigError(f"num_questions: {count} asked but the test split has {len(data.test)} "
                          f"(protocol {protocol.value} asks test questions only{order})")
    return count


def _sgl_eval_plan(data: Gsm8k, num_questions: int | None, seed: int, max_tokens: int) -> ProtocolPlan:
    count = _test_count(data, num_questions, ProtocolName.SGL_EVAL, ", in file order")
    prompts = [Prompt(i, sgl_eval_expected(data.test[i].solution),
                      messages=(("user", SGL_EVAL_PROMPT.format(problem=data.test[i].question)),))
               for i in range(count)]
    return _finish(data, ProtocolName.SGL_EVAL, "chat", prompts, (), max_tokens, [], seed)


def _sglang_fewshot_plan(data: Gsm8k, num_questions: int | None, seed: int, max_tokens: int) -> ProtocolPlan:
    shots = list(range(NUM_SHOTS))
    prefix = "".join(_sglang_example(data.test[i], True) + "\n\n" for i in shots)
    count = _test_count(data, num_questions, ProtocolName.SGLANG_FEWSHOT, "")
    prompts = [Prompt(i, extract_sglang_integer(data.test[i].solution) or "",
                      prefix + _sglang_example(data.test[i], False), teacher=" " + data.test[i].solution)
               for i in range(count)]
    return _finish(data, ProtocolName.SGLANG_FEWSHOT, "generate", prompts, SGLANG_STOP, max_tokens, shots, seed)


def _train_shots(data: Gsm8k, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(len(data.train)), NUM_SHOTS))


def _mixed_prefix_plan(data: Gsm8k, num_questions: int | None, seed: int, max_tokens: int) -> ProtocolPlan:
    shots = _train_shots(data, seed)
    others = [i for i in range(len(data.train)) if i not in set(shots)]
    shots += random.Random(seed + 2).sample(others, MIXED_SECONDARY)
    prompts = [_prompt(ProtocolName.MIXED_PREFIX, index, problem, _mixed_prefix(data, shots, seed, index), ())
               for index, problem in _chosen(data, shots, num_questions, seed)]
    return _finish(data, ProtocolName.MIXED_PREFIX, "completions", prompts, CLEAN_STOP, max_tokens, shots, seed)


def _few_shot_plan(protocol: ProtocolName, endpoint: Endpoint, stop: tuple[str, ...]):
    """clean and chat: the seeded train shots before each question, as text or as chat turns."""
    def build(data: Gsm8k, num_questions: int | None, seed: int, max_tokens: int) -> ProtocolPlan:
        shots = _train_shots(data, seed)
        prefix, turns = _shots(protocol, data, shots)
        prompts = [_prompt(protocol, index, problem, prefix, turns)
                   for index, problem in _chosen(data, shots, num_questions, seed)]
        return _finish(data, protocol, endpoint, prompts, stop, max_tokens, shots, seed)
    return build


def _shots(name: ProtocolName, data: Gsm8k, shots: list[int] | tuple[int, ...]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The shots as a clean prompt's prefix, or as a chat's turns."""
    if name == ProtocolName.CLEAN:
        return "".join(_clean_example(data.train[i]) for i in shots), ()
    turns: list[tuple[str, str]] = []
    for i in shots:
        turns += [("user", f"Question: {data.train[i].question}"),
                  ("assistant", clean_solution(data.train[i].solution))]
    return "", tuple(turns)


def _run_eval_plan(data: Gsm8k, num_questions: int | None, seed: int, max_tokens: int) -> ProtocolPlan:
    """GSM8KEval: the shots are test[0:5], the questions test[5:] in file order (never the shots)."""
    shots = list(range(NUM_SHOTS))
    prefix = "".join(_sglang_example(data.test[i], True) + "\n\n" for i in shots)
    pool = range(NUM_SHOTS, len(data.test))
    if num_questions is not None and num_questions > len(pool):
        raise ConfigError(f"num_questions: {num_questions} asked but GSM8KEval has {len(pool)} questions "
                          f"(the test split less its {NUM_SHOTS} shots)")
    chosen = pool if num_questions is None else pool[:num_questions]
    prompts = [Prompt(i, extract_sglang_run_eval(data.test[i].solution) or "",
                      prefix + _sglang_example(data.test[i], False), teacher=" " + data.test[i].solution)
               for i in chosen]
    return _finish(data, ProtocolName.SGLANG_RUN_EVAL, "completions", prompts, SGLANG_STOP, max_tokens, shots, seed)


def _clean_example(problem: Problem) -> str:
    return f"Question: {problem.question}\nAnswer: {clean_solution(problem.solution)}\n\n"


def _sglang_example(problem: Problem, include_answer: bool) -> str:
    text = "Question: " + problem.question + "\nAnswer:"
    return text + " " + problem.solution if include_answer else text


def _finish(data: Gsm8k, name: ProtocolName, endpoint: Endpoint, prompts: list[Prompt], stop: tuple[str, ...],
            max_tokens: int, shots: list[int], seed: int) -> ProtocolPlan:
    return fingerprinted(ProtocolPlan(name.value, endpoint, tuple(prompts), stop, max_tokens, 0.0, tuple(shots), seed,
                                      data.sha256, "", grader=_GRADERS[name], extensible=name in _EXTENSIBLE))


# Each protocol's plan, by name: what `build_plan` builds.
_BUILDERS = {
    ProtocolName.CLEAN: _few_shot_plan(ProtocolName.CLEAN, "completions", CLEAN_STOP),
    ProtocolName.CHAT: _few_shot_plan(ProtocolName.CHAT, "chat", ()),
    ProtocolName.MIXED_PREFIX: _mixed_prefix_plan,
    ProtocolName.SGLANG_FEWSHOT: _sglang_fewshot_plan,
    ProtocolName.SGLANG_RUN_EVAL: _run_eval_plan,
    ProtocolName.SGL_EVAL: _sgl_eval_plan,
}

EXTENSION_INDEX_OFFSET = 100_000  # train question i is recorded as index 100000 + i


def extension_plan(data: Gsm8k, plan: ProtocolPlan, count: int) -> ProtocolPlan | None:
    """`count` more questions for undecided cells, with the plan's template: first the test
    questions the plan did not ask (continuing its seeded order), then train questions that are not
    shots, in their seeded order (recorded as EXTENSION_INDEX_OFFSET + i). None when the protocol has
    no clean extension (sglang-fewshot, sglang-run-eval: their questions are fixed by sglang's test)."""
    if not can_extend(plan) or count <= 0:
        return None
    asked = {p.index for p in plan.prompts}
    chosen = [(i, data.test[i]) for i in _question_order(len(data.test), None, plan.seed) if i not in asked]
    chosen += [(EXTENSION_INDEX_OFFSET + i, data.train[i]) for i in _train_pool(data, plan.shot_indices, plan.seed)
               if EXTENSION_INDEX_OFFSET + i not in asked]
    name = ProtocolName(plan.name)
    prefix, turns = _shots(name, data, plan.shot_indices) if name != ProtocolName.MIXED_PREFIX else ("", ())
    prompts = [_prompt(name, index, problem,
                       _mixed_prefix(data, plan.shot_indices, plan.seed, index) if name == ProtocolName.MIXED_PREFIX
                       else prefix, turns) for index, problem in chosen[:count]]
    return ProtocolPlan(**{**plan.__dict__, "prompts": tuple(prompts), "fingerprint": plan.fingerprint + "+ext"})


def can_extend(plan: ProtocolPlan) -> bool:
    """Whether undecided cells of this protocol can be asked more questions (`extension_plan`)."""
    return plan.extensible
