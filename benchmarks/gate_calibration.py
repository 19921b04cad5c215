"""Does the gate cry wolf, does it sleep? Figures computed on answers drawn from simulator worlds
(World.decide, no HTTP), judged by the product's own gate (harness.gate.verdict.judge), beside the
fixed rule used in the field today: `accuracy > floor` on the first 200 questions.

    .venv/bin/python benchmarks/gate_calibration.py [--nights 200] [--trials 200]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.gate.sequential import EarlyStop, Looks  # noqa: E402
from harness.gate.verdict import judge  # noqa: E402
from harness.gsm8k.dataset import load_gsm8k  # noqa: E402
from harness.gsm8k.evaluator import score  # noqa: E402
from harness.results.records import CellOutcome, QuestionRecord, Status  # noqa: E402
from harness.sim.world import Bug, SimModel, World  # noqa: E402
from harness.suite.config import GateSpec  # noqa: E402

MODELS = {"kimi": 0.90, "dsv2": 0.90}
FLOOR = 0.88  # as tight as sglang's CI writes them (Kimi-Linear: mean 0.899, threshold 0.88)
BACKENDS = ("fa3", "flashinfer", "flashmla", "triton")
GATE = GateSpec(alpha=0.01, min_effect=0.02)


def outcome(cell_id: str, answers: list[tuple[int, bool]]) -> CellOutcome:
    records = [QuestionRecord(index=i, prompt_sha="", gold="", pred="", correct=ok, correct_strict=ok,
                              finish_reason="stop", output="", latency_s=0, output_tokens=0) for i, ok in answers]
    return CellOutcome(cell_id=cell_id, args=[], score=score(records, 1.0), questions=records)


def world(seed: int, flip_rate: float, bugs: list[Bug] | None = None) -> World:
    return World(seed=seed, flip_rate=flip_rate, models={m: SimModel(accuracy=a) for m, a in MODELS.items()},
                 bugs=bugs or [])


def resolved(backend: str, um: str, rc: str) -> dict:
    return {"attention_backend": backend, "enable_unified_memory": um == "on", "disable_radix_cache": rc == "off",
            "tp_size": 1, "random_seed": 0}


def night_verdicts(w: World, questions: list[tuple[int, str]]) -> tuple[bool, bool]:
    """(the gate failed some cell, the fixed rule failed some cell) for one night of the 32-cell matrix."""
    gate_fail = fixed_fail = False
    cells = list(itertools.product(MODELS, BACKENDS, ("off", "on"), ("on", "off")))
    references: dict[str, CellOutcome] = {}
    for model, backend, um, rc in sorted(cells, key=lambda c: (c[1], c[2], c[3]) != ("triton", "off", "on")):
        answers = [(i, w.decide(model, q, resolved(backend, um, rc), True).kind == "right") for i, q in questions]
        cell = outcome(f"{model}.{backend}.{um}.{rc}", answers)
        reference = references.setdefault(model, cell)
        verdict = judge(cell, FLOOR, GATE, len(cells), None if reference is cell else reference)
        gate_fail |= verdict.status is Status.FAIL
        fixed_fail |= sum(ok for _, ok in answers[:200]) / 200 <= FLOOR
    return gate_fail, fixed_fail


def false_alarms(data, nights: int) -> None:
    gate = fixed = 0
    for night in range(nights):
        rng = random.Random(night)
        picked = rng.sample(range(len(data.test)), 200)
        gate_fail, fixed_fail = night_verdicts(world(1000 + night, 0.10), [(i, data.test[i].question) for i in picked])
        gate += gate_fail
        fixed += fixed_fail
    print(f"false alarms over {nights} healthy nights of 32 cells (accuracy 0.90, floor {FLOOR}, 200 questions):")
    print(f"  this gate: {gate / nights:.1%} of nights with any fail   fixed rule: {fixed / nights:.1%}")


def detect(data, trials: int, agreement: float, drop: float, questions: int) -> tuple[float, float]:
    """(gate power, fixed-rule power) for one cell losing `drop` points against its reference."""
    flip_rate = (1 - agreement) / (2 * 0.9 * 0.1 * 2)  # two cells disagree on ~2 f 2p(1-p) questions
    pool = [p.question for p in data.test] + [p.question for p in data.train]
    gate_hits = fixed_hits = 0
    for trial in range(trials):
        bug = Bug(name="regression", when={"attention_backend": "fa3"}, corrupt_probability=(drop / 0.9, drop / 0.9),
                  style="wrong")
        w = world(5000 + trial, flip_rate, [bug])
        asked = list(enumerate(pool[:questions]))
        reference = outcome("ref", [(i, w.decide("kimi", q, resolved("triton", "off", "on"), True).kind == "right")
                                    for i, q in asked])
        answers = [(i, w.decide("kimi", q, resolved("fa3", "off", "on"), True).kind == "right") for i, q in asked]
        verdict = judge(outcome("cell", answers), FLOOR, GATE, 32, reference)
        gate_hits += verdict.status is Status.FAIL
        fixed_hits += sum(ok for _, ok in answers[:200]) / 200 <= FLOOR
    return gate_hits / trials, fixed_hits / trials


def power(data, trials: int) -> None:
    print(f"power: one cell loses points against its reference ({trials} trials each; fixed rule on the first 200)")
    print(f"  {'agreement':>9} {'drop':>5} {'questions':>9} {'this gate':>10} {'fixed rule':>11}")
    for agreement, drop, questions in [(0.95, 0.03, 1319), (0.95, 0.03, 2638), (0.98, 0.03, 1319), (0.95, 0.02, 1319),
                                       (0.95, 0.02, 2638), (0.95, 0.05, 1319)]:
        gate, fixed = detect(data, trials, agreement, drop, questions)
        print(f"  {agreement:>9.2f} {drop:>5.2f} {questions:>9} {gate:>10.1%} {fixed:>11.1%}")


def early_stop(data) -> None:
    rng = random.Random(7)
    healthy_stops = 0
    cells = 10_000
    for _ in range(cells):
        records = [QuestionRecord(index=i, prompt_sha="", gold="", pred="", correct=rng.random() < 0.90,
                                  finish_reason="stop", output="", latency_s=0, output_tokens=0) for i in range(160)]
        rule = EarlyStop(floor=0.85, total=1319)
        healthy_stops += any(rule.check(records[:n]) for n in (20, 40, 80, 160))
    w = world(0, 0.10, [Bug(name="incident", when={"enable_unified_memory": True}, corrupt_probability=(0.66, 0.94))])
    decided = []
    for backend in ("fa3", "flashinfer", "flashmla"):
        answers = [w.decide("kimi", p.question, resolved(backend, "on", "on"), True).kind == "right" for p in data.test]
        records = [QuestionRecord(index=i, prompt_sha="", gold="", pred="", correct=ok, finish_reason="stop", output="",
                                  latency_s=0, output_tokens=0) for i, ok in enumerate(answers)]
        rule = EarlyStop(floor=0.85, total=1319)
        decided.append(next(n for n in range(1, 1320) if rule.check(records[:n])))
    print(f"early stop: incident cells decided after {decided} questions (of 1,319: "
          f"{1 - max(decided) / 1319:.0%} of evaluation saved); healthy cells stopped: {healthy_stops} of {cells:,}")
    # The same cells on a server whose broken answers (junk up to the token limit) come back last.
    slow_broken = []
    for backend in ("fa3", "flashinfer", "flashmla"):
        answers = [w.decide("kimi", p.question, resolved(backend, "on", "on"), True).kind == "right" for p in data.test]
        arrival = sorted(range(len(answers)), key=lambda i: not answers[i])  # right answers first
        looks = Looks(EarlyStop(floor=0.85, total=1319))
        for count, i in enumerate(arrival, start=1):
            reason = looks.add(QuestionRecord(index=i, prompt_sha="", gold="", pred="", correct=answers[i],
                                              finish_reason="stop", output="", latency_s=0, output_tokens=0))
            if reason:
                slow_broken.append((reason.split(":")[0].removeprefix("stopped early after the first "), count))
                break
    print(f"early stop when broken answers come back last: {slow_broken} (look, answers back when it decided)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=200)
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    data = load_gsm8k()
    false_alarms(data, args.nights)
    power(data, args.trials)
    early_stop(data)


if __name__ == "__main__":
    main()
