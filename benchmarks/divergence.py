"""How much does teacher-forced divergence add to one bit per question? The demo's matrix
(configs/demo.yaml: 32 cells, 200 questions) played through the gate's own functions (`judge`, the
run's `Budget`), with answers and teacher-forced log-probabilities from the simulator's world
(configs/sim/incident.yaml, `World.decide` and `World.teacher_forced`) instead of servers. Each
trial redraws the world's seed: which questions the model knows, which requests the bug corrupts,
every configuration's numeric drift.

    .venv/bin/python benchmarks/divergence.py [--trials 100] [--nights 100]
    .venv/bin/python benchmarks/divergence.py --quick     # what the test suite runs: 1 of each

Scenarios:
- incident: the shipped world. Questions needed to decide each of the three incident cells (the
  first n of the seeded order, n = 5, 10, 15, ...), by divergence and by accuracy (floor or paired
  test), each at its share of the cell's stage-1 alpha.
- quiet bug: the incident's bug with style `unchanged` (every final answer kept), moving an affected
  request's log-probabilities by 0.3 x [0.5, 1.5) nats per token on 30-60% of requests: the share of
  incident cells the divergence test fails at 200 questions (accuracy cannot see it).
- healthy nights: no bug, the world's backend offsets (assumed, not measured: fa3 0.01, triton
  0.02, flashinfer 0.03, flashmla 0.04 nats per token, each times an exponential per question): the
  share of nights with any cell failed by divergence, and the chance a cell fails computed from the
  measured share of its questions beyond the tolerance (exact binomial tail at the test's critical
  count, summed over the cells: a union bound on a night); then with offsets x3, at the gate's
  tolerance and at the one `regress calibrate` proposes from 3 earlier nights.

Exact 95% intervals (Clopper-Pearson) on every share.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.analysis.calibrate import propose_divergence  # noqa: E402
from harness.benchmark.gsm8k.dataset import load_gsm8k  # noqa: E402
from harness.benchmark.gsm8k.protocol import build_plan  # noqa: E402
from harness.benchmark.scoring import score  # noqa: E402
from harness.engine.launch import planned_argv  # noqa: E402
from harness.gate.budget import Budget  # noqa: E402
from harness.gate.divergence import divergence_test  # noqa: E402
from harness.gate.verdict import Stage, judge  # noqa: E402
from harness.records import CellOutcome, CellResult, QuestionRecord, Status, TeacherForced  # noqa: E402
from harness.sim.args import build_parser, resolve  # noqa: E402
from harness.sim.server import split_prompt  # noqa: E402
from harness.sim.world import World, load_world  # noqa: E402
from harness.suite.config import load_suite  # noqa: E402
from harness.suite.matrix import Cell, expand  # noqa: E402

SUITE = ROOT / "configs" / "demo.yaml"
WORLD = ROOT / "configs" / "sim" / "incident.yaml"
LOOKS = tuple(range(5, 201, 5))


def exact_interval(hits: int, n: int) -> str:
    from scipy.stats import binomtest

    if n == 0:
        return "-"
    interval = binomtest(hits, n).proportion_ci(0.95, method="exact")
    return f"{hits}/{n} = {hits / n:.1%} [{interval.low:.1%}, {interval.high:.1%}]"


@dataclass
class Setup:
    world: World
    cells: list[Cell]
    resolved: dict[str, dict]
    prompts: list
    stage_alpha: float
    gate: object

    def outcome(self, cell: Cell, world: World, count: int | None = None) -> CellOutcome:
        resolved = self.resolved[cell.cell_id]
        radix = not resolved["disable_radix_cache"]
        records = []
        for position, prompt in enumerate(self.prompts[:count]):
            _, question = split_prompt(prompt.text)
            decision = world.decide(resolved["model_path"], question, resolved, radix and position > 0)
            scores = world.teacher_forced(resolved["model_path"], question, prompt.teacher, resolved, radix)
            records.append(QuestionRecord(
                index=prompt.index, prompt_sha="", gold=prompt.gold, pred=None, correct=decision.kind == "right",
                correct_strict=decision.kind == "right", finish_reason="stop", output="", latency_s=0.0,
                output_tokens=1, teacher=TeacherForced(start=1, token_ids=list(scores.token_ids),
                                                       logprobs=list(scores.logprobs), top_ids=list(scores.top_ids))))
        return CellOutcome(cell_id=cell.cell_id, args=[], score=score(records, 1.0), questions=records)


def setup() -> Setup:
    loaded = load_suite(SUITE)
    matrix = expand(loaded.suite)
    world = load_world(WORLD)
    parser = build_parser(world.attention_backends)
    resolved = {}
    for cell in matrix.cells:
        argv = [a.replace("{port}", "0").replace("{nccl_port}", "0") for a in planned_argv(loaded, cell)[3:]]
        resolved[cell.cell_id] = resolve(parser.parse_args(argv), world)
    gate = loaded.suite.gate
    budget = Budget(gate.alpha, len(matrix.cells), gate.early_stop_share,
                    gate.extension_share if gate.extend_to else 0.0)
    prompts = list(build_plan(load_gsm8k(None), loaded.suite.protocol, 200, loaded.suite.seed).prompts)
    return Setup(world, list(matrix.cells), resolved, prompts, budget.stage(1), gate)


def reference_of(setup: Setup, cell: Cell) -> Cell:
    return next(c for c in setup.cells if c.cell_id == cell.reference_cell)


def incident_cells(setup: Setup) -> list[Cell]:
    """The demo's three cells the incident's bug breaks (Kimi-Linear, an MLA backend, unified memory and radix on)."""
    return [c for c in setup.cells if "um-on.rc-on" in c.cell_id and c.model.id == "kimi-linear"
            and "triton" not in c.cell_id]


def reseeded(world: World, seed: int, **changes) -> World:
    return world.model_copy(update={"seed": seed, **changes})


def incident(setup: Setup, trials: int, console: Console) -> None:
    broken = incident_cells(setup)
    alpha = setup.stage_alpha / 3  # floor, paired accuracy, divergence
    by_divergence, by_accuracy = [], []
    for trial in range(trials):
        world = reseeded(setup.world, trial)
        for cell in broken:
            ours, theirs = setup.outcome(cell, world), setup.outcome(reference_of(setup, cell), world)
            needed_d = needed_a = None
            for n in LOOKS:
                mine = ours.model_copy(update={"questions": ours.questions[:n], "score": score(ours.questions[:n], 1)})
                ref = theirs.model_copy(update={"questions": theirs.questions[:n], "score": score(theirs.questions[:n], 1)})
                verdict = judge(mine, cell.model.floor, setup.gate, Stage(alpha=setup.stage_alpha), reference=ref)
                if needed_d is None and verdict.divergence_p is not None and verdict.divergence_p < alpha:
                    needed_d = n
                if needed_a is None and min(verdict.floor_p or 1, verdict.mcnemar_p or 1) < alpha:
                    needed_a = n
                if needed_d and needed_a:
                    break
            by_divergence.append(needed_d or 10**9)
            by_accuracy.append(needed_a or 10**9)
    table = Table(title=f"incident cells: questions needed to decide ({trials} trials x {len(broken)} cells, "
                        f"each test at {alpha:.2g})")
    for column in ("evidence", "median", "worst", "decided within 20 questions"):
        table.add_column(column)
    for name, needed in (("divergence", by_divergence), ("accuracy (floor or paired)", by_accuracy)):
        ordered = sorted(needed)
        worst = ordered[-1] if ordered[-1] < 10**9 else "undecided at 200"
        table.add_row(name, str(ordered[len(ordered) // 2]), str(worst),
                      exact_interval(sum(n <= 20 for n in needed), len(needed)))
    console.print(table)


def quiet_bug(setup: Setup, trials: int, console: Console) -> None:
    bugs = [bug.model_copy(update={"style": "unchanged", "divergence": 0.3, "corrupt_probability": (0.3, 0.6)})
            for bug in setup.world.bugs]
    broken = incident_cells(setup)
    caught = by_accuracy = 0
    for trial in range(trials):
        world = reseeded(setup.world, trial, bugs=bugs)
        for cell in broken:
            verdict = judge(setup.outcome(cell, world), cell.model.floor, setup.gate, Stage(alpha=setup.stage_alpha),
                            reference=setup.outcome(reference_of(setup, cell), world))
            caught += verdict.status is Status.FAIL and (verdict.divergence_p or 1) < setup.stage_alpha / 3
            by_accuracy += min(verdict.floor_p or 1, verdict.mcnemar_p or 1) < setup.stage_alpha / 3
    total = trials * len(broken)
    table = Table(title="a bug that changes no final answer: incident cells failed at 200 questions")
    table.add_column("evidence")
    table.add_column("caught")
    table.add_row("divergence", exact_interval(caught, total))
    table.add_row("accuracy (floor or paired)", exact_interval(by_accuracy, total))
    console.print(table)


def healthy_nights(setup: Setup, nights: int, console: Console, calibration_nights: int = 3) -> None:
    from scipy.stats import binom

    table = Table(title=f"healthy nights (no bug), {len(setup.cells)} cells x 200 questions")
    for column in ("offsets", "tolerance (nats/token)", "nights with a divergence fail",
                   "questions beyond: all cells / worst cell", "computed P(a night fails)"):
        table.add_column(column)
    spec = setup.gate.divergence
    alpha = setup.stage_alpha / 3
    critical = next(k for k in range(201) if binom.sf(k - 1, 200, spec.healthy_share) < alpha)
    for scale, calibrated in ((1, False), (3, False), (3, True)):
        drifts = {name: value * scale for name, value in setup.world.backend_drift.items()}
        tolerance = spec.tolerance
        if calibrated:  # what `regress calibrate` proposes from earlier nights
            measured = []
            for night in range(calibration_nights):
                world = reseeded(setup.world, 10_000 + night, bugs=[], backend_drift=drifts,
                                 logprob_drift=setup.world.logprob_drift * scale)
                outcomes = {cell.cell_id: setup.outcome(cell, world).questions for cell in setup.cells}
                highs = {cell.cell_id: divergence_test(outcomes[cell.cell_id], outcomes[cell.reference_cell], 1.0, 0.1).high
                         for cell in setup.cells if cell.reference_cell is not None}
                measured.append((None, [CellResult(cell_id=cell.cell_id, model=cell.model.id, factors=cell.factors,
                                                   args=[], resolved={}, status=Status.PASS, reason="",
                                                   reference_cell=cell.reference_cell,
                                                   divergence_high=highs.get(cell.cell_id))
                                        for cell in setup.cells]))
            tolerance = max(p.proposed for p in propose_divergence(measured, {m: spec.tolerance for m in
                                                                                {c.model.id for c in setup.cells}}))
        failed_nights = 0
        beyond: dict[str, int] = {}
        compared: dict[str, int] = {}
        for night in range(nights):
            world = reseeded(setup.world, night, bugs=[], backend_drift=drifts,
                             logprob_drift=setup.world.logprob_drift * scale)
            failed = False
            outcomes = {cell.cell_id: setup.outcome(cell, world).questions for cell in setup.cells}
            for cell in setup.cells:
                if cell.reference_cell is None:
                    continue
                found = divergence_test(outcomes[cell.cell_id], outcomes[cell.reference_cell], tolerance,
                                        spec.healthy_share)
                failed |= found.p < alpha
                beyond[cell.cell_id] = beyond.get(cell.cell_id, 0) + found.beyond
                compared[cell.cell_id] = compared.get(cell.cell_id, 0) + found.n
            failed_nights += failed
        shares = {cell_id: beyond[cell_id] / compared[cell_id] for cell_id in compared}
        pooled = sum(beyond.values()) / sum(compared.values())
        # A night fails if any cell does: at most the sum of the cells' chances (union bound), each
        # cell at its measured share beyond the tolerance.
        night_bound = min(1.0, sum(binom.sf(critical - 1, 200, share) for share in shares.values()))
        table.add_row(f"x{scale}", f"{tolerance:.3g}" + (" (calibrated)" if calibrated else " (gate default)"),
                      exact_interval(failed_nights, nights), f"{pooled:.2%} / {max(shares.values()):.2%}",
                      f"{night_bound:.2g} (a cell fails at >= {critical} of 200)")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--nights", type=int, default=100)
    parser.add_argument("--quick", action="store_true",
                        help="1 trial, 1 night, 1 calibration night: that it runs, not its figures")
    args = parser.parse_args()
    trials, nights, calibration = (1, 1, 1) if args.quick else (args.trials, args.nights, 3)
    console = Console(width=160)
    state = setup()
    incident(state, trials, console)
    quiet_bug(state, trials, console)
    healthy_nights(state, nights, console, calibration)


if __name__ == "__main__":
    main()
