"""What a cell's self-checks catch with no reference to compare with, and how often they fail a
healthy cell: the demo's matrix (configs/demo.yaml: 32 cells, 200 questions, 20 of them sampled per
cell) played through the gate's own `self_checks` at each cell's share of the run's budget
(`run_budget`: alpha / cells x gate.self_checks.share, split over the checks made), with answers and
teacher-forced log-probabilities from the simulator's world (configs/sim/incident.yaml) instead of
servers. Each trial redraws the world's seed.

    .venv/bin/python benchmarks/self_checks.py [--trials 100]
    .venv/bin/python benchmarks/self_checks.py --quick     # what the test suite runs: 1 trial

How each sampled question's checks are drawn, as the simulator serves them (harness.sim.server):
the evaluation's teacher-forced request batched with others and warm (a prefix-cache hit with the
radix cache on); `alone` warm and not batched; `cold` neither (the cache flushed); the replay's
answer warm (its whole prompt seen) and batched (replays run side by side); the decode check's
answer cold (decoded from position 0: its numbers are a prefill's), its follow-up warm, a prefix
hit and (radix on) a decode-cache hit, both against a prefill from scratch. One bug class at a
time, on one cell (Kimi-Linear, fa3, unified memory and radix on), its reference untouched; and
each class on the *reference* (Kimi-Linear, triton), its cells untouched:

- warm: right cold, wrong warm (sglang PR #16053's class), answers wrong;
- kv on hits: the cache's KV rows read wrong on a hit, log-probabilities only (no final answer moves);
- batched: a request's numbers depend on what is batched with it, log-probabilities only;
- decode hit: rows a decode wrote, read back from the cache, are wrong (the decode-cache-hit class
  of sglang's kl_test_utils), log-probabilities only;
- healthy: no bug (the world's numeric drift only).

Exact 95% intervals (Clopper-Pearson).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))
from divergence import exact_interval, reseeded, setup  # noqa: E402

from harness.benchmark.decode_check import DECODED_TOKENS, FOLLOW_TOKENS  # noqa: E402
from harness.benchmark.gsm8k.dataset import load_gsm8k  # noqa: E402
from harness.benchmark.gsm8k.protocol import build_plan  # noqa: E402
from harness.gate.self_checks import CHECKS, self_checks  # noqa: E402
from harness.records import DecodeCheck, QuestionRecord, Replay, SelfChecks, TeacherForced  # noqa: E402
from harness.run.build import RunInputs  # noqa: E402
from harness.run.pipeline import run_budget, self_check_count  # noqa: E402
from harness.sim.server import split_prompt  # noqa: E402
from harness.suite.matrix import Matrix  # noqa: E402

TARGET = "kimi-linear.ab-fa3.um-on.rc-on"
REFERENCE = "kimi-linear.ab-triton.um-off.rc-on"
CLASSES = {
    "warm": {"trigger": "warm", "style": "wrong"},
    "kv on hits": {"trigger": "prefix_hit", "style": "unchanged"},
    "batched": {"trigger": "batched", "style": "unchanged"},
    "decode hit": {"trigger": "decode_hit", "style": "unchanged"},
    "healthy": None,
}


def teacher(world, resolved, question, continuation, hit: bool, batched: bool) -> TeacherForced:
    scores = world.teacher_forced(resolved["model_path"], question, continuation, resolved, hit, batched=batched)
    return TeacherForced(start=1, token_ids=list(scores.token_ids), logprobs=list(scores.logprobs),
                         top_ids=list(scores.top_ids))


def decode(world, resolved, question, text: str, radix: bool) -> DecodeCheck:
    """The decode check of one question as the simulator serves it: the answer decoded cold (a
    prefill's numbers), the follow-up warm with (radix on) its answer's decoded rows cached."""
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)][:DECODED_TOKENS + FOLLOW_TOKENS]
    model = resolved["model_path"]
    cold = list(world.teacher_forced(model, question, "", resolved, False, chunks=pieces).logprobs)
    warm = world.teacher_forced(model, question, "", resolved, radix, chunks=pieces, decode_hit=radix, warm=radix)
    split = min(DECODED_TOKENS, len(pieces) - 1)
    return DecodeCheck(prompt_tokens=1, token_ids=list(range(len(pieces))), decoded=cold[:split] + list(warm.logprobs[split:]),
                       prefilled=cold, follow_start=split, follow_cached=len(pieces) if radix else 0)


def cell_records(state, cell, world, sampled: int) -> list[QuestionRecord]:
    """The cell's first `sampled` questions (a prefix of the seeded order: a random sample) with their
    self-checks, as the simulator would serve them."""
    resolved = state.resolved[cell.cell_id]
    radix = not resolved["disable_radix_cache"]
    records = []
    for position, prompt in enumerate(state.prompts[:sampled]):
        _, question = split_prompt(prompt.text)
        model = resolved["model_path"]
        first = world.decide(model, question, resolved, radix and position > 0, batched=True)
        again = world.decide(model, question, resolved, radix, warm=radix, batched=True)
        checks = SelfChecks(alone=teacher(world, resolved, question, prompt.teacher, radix, False),
                            cold=teacher(world, resolved, question, prompt.teacher, False, False),
                            replay=Replay(correct=again.kind == "right", correct_strict=again.kind == "right",
                                          output=again.kind),
                            decode=decode(world, resolved, question, prompt.teacher, radix))
        records.append(QuestionRecord(
            index=prompt.index, prompt_sha="", gold=prompt.gold, pred=None, correct=first.kind == "right",
            correct_strict=first.kind == "right", finish_reason="stop", output=first.kind, latency_s=0.0,
            output_tokens=1, teacher=teacher(world, resolved, question, prompt.teacher, radix, True), checks=checks))
    return records


def play(state, trials: int, console: Console, sampled: int | None = None) -> None:
    from harness.suite.config import load_suite

    loaded = load_suite(ROOT / "configs" / "demo.yaml")
    data = load_gsm8k(None)
    plan = build_plan(data, loaded.suite.protocol, len(state.prompts), loaded.suite.seed)
    inputs = RunInputs(loaded, Matrix(tuple(state.cells)), data, plan)
    sampled = sampled or self_check_count(inputs)
    alpha = run_budget(inputs).self_check
    spec = state.gate
    table = Table(title=f"self-checks: {sampled} of {len(state.prompts)} questions sampled per cell, "
                        f"{alpha:.2g} per cell over its checks ({trials} trials)")
    for column in ("bug class", "on", "the broken cell failed", f"by check ({' / '.join(CHECKS)})",
                   "healthy cells failed (of all)"):
        table.add_column(column)
    for name, bug in CLASSES.items():
        for on in ((TARGET, REFERENCE) if bug else (None,)):
            caught, by_check, healthy_failed, healthy_total = 0, dict.fromkeys(CHECKS, 0), 0, 0
            for trial in range(trials):
                bugs = []
                if bug:  # on exactly that configuration
                    resolved = state.resolved[on]
                    bugs = [state.world.bugs[0].model_copy(update={
                        "name": name, "models": [resolved["model_path"]],
                        "when": {key: resolved[key] for key in ("attention_backend", "enable_unified_memory",
                                                                "disable_radix_cache", "chunked_prefill_size")},
                        "corrupt_probability": (0.5, 0.9), **bug})]
                world = reseeded(state.world, trial, bugs=bugs)
                for cell in state.cells:
                    made, _ = self_checks(cell_records(state, cell, world, sampled),
                                          spec.divergence.tolerance, spec.divergence.healthy_share, spec.tolerance)
                    failed = [check.name for check in made if check.p < alpha / max(len(made), 1)]
                    if cell.cell_id == on:
                        caught += bool(failed)
                        for check in failed:
                            by_check[check] += 1
                    else:
                        healthy_failed += bool(failed)
                        healthy_total += 1
            table.add_row(name, on or "-", exact_interval(caught, trials) if on else "-",
                          " / ".join(str(by_check[c]) for c in CHECKS) if on else "-",
                          exact_interval(healthy_failed, healthy_total))
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--sampled", default="", help="questions sampled per cell, comma-separated (default: the "
                                                      "demo's own, gate.self_checks.count of its 200)")
    parser.add_argument("--quick", action="store_true", help="1 trial: that it runs, not its figures")
    args = parser.parse_args()
    state = setup()
    for sampled in [int(n) for n in args.sampled.split(",") if n] or [None]:
        play(state, 1 if args.quick else args.trials, Console(width=200), sampled)


if __name__ == "__main__":
    main()
