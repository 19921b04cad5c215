"""Does the gate cry wolf, does it sleep? Nights of the shipped suites (configs/demo.yaml: 32 cells,
200 questions, extended to 1,319; configs/nightly.yaml: 72 cells, 1,319, extended to 2,638) played
through the product's own gating (`Gating`: early stop, the budget, both stages, `extend`), with
answers drawn from a model of real servers instead of Ray and HTTP, in the audit's scenarios.

    .venv/bin/python benchmarks/gate_calibration.py [--nights 200] [--trials 200] [--suites demo,nightly]

The answer model: each model knows a fixed set of questions (accuracy 0.90 on the protocol's
planned questions, as a fixed-seed protocol has one true accuracy), and every cell, every night,
redraws 13.9% of its answers at random: two healthy cells then agree on 95% of questions, as
backends do. Each trial plays two nights: the first is judged as a first run (no history), the
second with the first as history (the steady state every later night is in). Scenarios:

- healthy: floor 2 points under the model (as sglang's CI sets Kimi-Linear's: mean 0.899, floor 0.88);
- at floor: the floor equal to the model's accuracy on the planned questions;
- lucky reference: on the judged night each reference is 3 sd (of a cell's night-to-night noise) above itself;
- backend offsets: every non-reference cell carries a real, fixed offset of N(0, 0.5 points);
- reference error: one model's reference cell errors; one of its cells really dropped 5 points;
- early-stopped reference: that reference answers its first 20 questions wrong (and stops); the same dropped cell.

Power: one cell of the nightly loses 3 points (95% agreement, and 98%), with history (steady state)
and on a first night. Early stop: the incident's cells, broken answers returned last.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.analysis.calibrate import propose_floors  # noqa: E402
from harness.benchmark.base import ProtocolPlan  # noqa: E402
from harness.benchmark.gsm8k.dataset import load_gsm8k  # noqa: E402
from harness.benchmark.gsm8k.protocol import EXTENSION_INDEX_OFFSET, build_plan  # noqa: E402
from harness.benchmark.scoring import score  # noqa: E402
from harness.errors import ErrorKind  # noqa: E402
from harness.gate.sequential import EarlyStop, Looks  # noqa: E402
from harness.records import CellError, CellOutcome, QuestionRecord, RunInfo, Status  # noqa: E402
from harness.results.sinks import Sinks  # noqa: E402
from harness.run.build import RunInputs  # noqa: E402
from harness.run.extension import extend  # noqa: E402
from harness.run.gating import Gating  # noqa: E402
from harness.run.pipeline import run_budget  # noqa: E402
from harness.suite.config import load_suite  # noqa: E402
from harness.suite.matrix import Cell, Matrix, expand  # noqa: E402

ACCURACY = 0.90
AGREEMENT = 0.95
QUIET = Console(quiet=True)


def redraw_rate(agreement: float) -> float:
    """Two cells that each redraw a share r of answers disagree on about 2 r 2p(1-p) questions."""
    return (1 - agreement) / (2 * 2 * ACCURACY * (1 - ACCURACY))


@dataclass(frozen=True)
class Scenario:
    name: str
    floor_below: float = 0.02  # the floor, this far under the model's accuracy
    lucky_sd: float = 0.0  # each reference is this many sd lucky on the judged night
    offset_sd: float = 0.0  # fixed per-cell offsets of the non-reference cells
    broken_reference: str | None = None  # "error" or "stopped", for the first model's reference
    dropped_cell: float = 0.0  # one cell of the first model really loses this much
    agreement: float = AGREEMENT
    calibration_nights: int = 0  # floors set by `regress calibrate` from this many earlier nights


SCENARIOS = (
    Scenario("healthy"),
    Scenario("at floor", floor_below=0.0),
    Scenario("lucky reference", lucky_sd=3.0),
    Scenario("backend offsets", offset_sd=0.005),
    Scenario("offsets, calibrated floors", offset_sd=0.005, calibration_nights=5),
    Scenario("reference error", broken_reference="error", dropped_cell=0.05),
    Scenario("early-stopped reference", broken_reference="stopped", dropped_cell=0.05),
)


class Answers:
    """Who answers what right, for one trial: the models' knowledge, each cell's fixed offset or bug,
    and each night's noise."""

    def __init__(self, seed: int, questions: list[int], planned: list[int], scenario: Scenario,
                 cells: list[Cell], dropped: dict[str, float]) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.position = {q: i for i, q in enumerate(questions)}
        self.planned = planned
        self.scenario = scenario
        self.redraw = redraw_rate(scenario.agreement)
        self.known: dict[str, np.ndarray] = {}
        test = np.array([i for i, q in enumerate(questions) if q < EXTENSION_INDEX_OFFSET])
        for model in sorted({c.model.id for c in cells}):
            known = self.rng.random(len(questions)) < ACCURACY
            # The model's accuracy on the test split is exactly ACCURACY (a fixed set has one true
            # accuracy); a subset of it, as a 200-question protocol asks, varies around it.
            order = self.rng.permutation(test)
            known[order[:round(ACCURACY * len(test))]] = True
            known[order[round(ACCURACY * len(test)):]] = False
            self.known[model] = known
        self.fixed: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # cell -> (made wrong, made right)
        for cell in cells:
            offset = 0.0 if cell.is_reference else self.rng.normal(0, scenario.offset_sd) if scenario.offset_sd else 0.0
            offset -= dropped.get(cell.cell_id, 0.0)
            draws = self.rng.random(len(questions))
            wrong = draws < (-offset / ACCURACY if offset < 0 else 0.0)
            right = draws < (offset / (1 - ACCURACY) if offset > 0 else 0.0)
            self.fixed[cell.cell_id] = (wrong, right)

    def night(self, cell: Cell, number: int, lucky: bool) -> np.ndarray:
        """Night `number`'s answers of `cell` to every question (in `questions` order): its noise is
        its own, whatever else was drawn (two Answers of one trial share knowledge, not noise)."""
        known = self.known[cell.model.id]
        rng = np.random.default_rng([self.seed, number, zlib.crc32(cell.cell_id.encode())])
        redrawn = rng.random(known.size) < self.redraw
        answers = np.where(redrawn, rng.random(known.size) < ACCURACY, known)
        wrong, right = self.fixed[cell.cell_id]
        answers = (answers & ~wrong) | right
        if lucky:
            n = len(self.planned)
            sd = np.sqrt(2 * self.redraw * ACCURACY * (1 - ACCURACY) / n)
            planned_wrong = [self.position[q] for q in self.planned if not answers[self.position[q]]]
            rng.shuffle(planned_wrong)
            answers[planned_wrong[:round(self.scenario.lucky_sd * sd * n)]] = True
        return answers


@functools.cache
def record(index: int, correct: bool) -> QuestionRecord:
    """One answer (shared between cells: records are never changed once made)."""
    return QuestionRecord.model_construct(index=index, prompt_sha="", gold="1", pred="1" if correct else "2",
                                          pred_strict=None, correct=correct, correct_strict=correct,
                                          finish_reason="stop", output="", latency_s=0.0, output_tokens=1,
                                          attempts=1, error=None)


class MemoryHistory:
    """The previous night, as `History` would read it back: each cell's answers where it passed."""

    def __init__(self, passed: dict[str, CellOutcome]) -> None:
        self.passed = passed

    def last_pass(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        found = self.passed.get(cell_id)
        return ("previous-night", found) if found is not None else None

    def pinned(self, cell_id: str) -> None:
        return None


@dataclass
class Night:
    inputs: RunInputs
    answers: Answers
    scenario: Scenario
    history: dict[str, CellOutcome]
    judged: bool  # the second night: references lucky, reference broken as the scenario says
    number: int = 0  # which night of the trial (its noise)
    tonight: dict[str, np.ndarray] | None = None

    def play(self) -> dict[str, tuple[Status, CellOutcome | None]]:
        """Every cell's final verdict and answers, through the product's gating and extension."""
        cells = list(self.inputs.matrix.cells)
        lucky = self.judged and self.scenario.lucky_sd > 0
        self.tonight = {c.cell_id: self.answers.night(c, self.number, lucky and c.is_reference) for c in cells}
        gating = Gating(self.inputs.loaded.suite.gate, run_budget(self.inputs), "fp", MemoryHistory(self.history),
                        Sinks([]))
        budget = run_budget(self.inputs)
        self.early_stop = budget.early_stop
        self.schedule(cells, self.inputs.plan, lambda cell, outcome, log, console: gating.offer(cell, outcome, log))
        extend(self.inputs, gating, self.schedule)
        gating.release_waiting()
        self.results = list(gating.results().values())
        return {cell_id: (result.status, gating.answers(cell_id)) for cell_id, result in gating.results().items()}

    def broken(self, cell: Cell) -> str | None:
        first_model = self.inputs.matrix.cells[0].model.id
        if self.judged and cell.is_reference and cell.model.id == first_model:
            return self.scenario.broken_reference
        return None

    def schedule(self, cells: list[Cell], plan: ProtocolPlan, on_outcome: Callable, label: str = "") -> None:
        main = plan is self.inputs.plan
        for cell in cells:
            on_outcome(cell, self.outcome(cell, plan, main), "", QUIET)

    def outcome(self, cell: Cell, plan: ProtocolPlan, main: bool) -> CellOutcome:
        if self.broken(cell) == "error":
            return CellOutcome(cell_id=cell.cell_id, args=[],
                               error=CellError(kind=ErrorKind.CRASHED, message="server exited with code 1"))
        answers = self.tonight[cell.cell_id]
        records = [record(p.index, bool(answers[self.answers.position[p.index]])) for p in plan.prompts]
        if self.broken(cell) == "stopped" and main:
            records[:20] = [record(r.index, False) for r in records[:20]]
        stopped = None
        if main and self.early_stop > 0 and cell.model.floor > 0:  # as CellJobs builds it: test questions
            test = [r for r in records if r.is_test]
            rule = EarlyStop(cell.model.floor, len(test), self.early_stop, order=tuple(r.index for r in test))
            for look, _ in rule.thresholds:
                stopped = rule.test_look(look, test[:look])
                if stopped:
                    records = test[:look]
                    break
        return CellOutcome(cell_id=cell.cell_id, args=[], score=score(records, 1.0), questions=records,
                           stopped_early=stopped)


def suite_inputs(name: str, data, scenario: Scenario) -> RunInputs:
    loaded = load_suite(ROOT / "configs" / f"{name}.yaml")
    plan = build_plan(data, loaded.suite.protocol, loaded.suite.num_questions, loaded.suite.seed,
                      loaded.suite.max_tokens)
    floor = round(ACCURACY - scenario.floor_below, 4)
    return with_floors(RunInputs(loaded, Matrix(()), data, plan), {m.id: floor for m in loaded.suite.models})


def with_floors(inputs: RunInputs, floors: dict[str, float]) -> RunInputs:
    """The same suite with these model floors (its matrix expanded again: cells carry their model)."""
    spec = inputs.loaded.suite
    models = [m.model_copy(update={"floor": floors.get(m.id, m.floor)}) for m in spec.models]
    spec = spec.model_copy(update={"models": models})
    return RunInputs(inputs.loaded.model_copy(update={"suite": spec}), Matrix(expand(spec).cells), inputs.data,
                     inputs.plan)


def questions_of(data, plan: ProtocolPlan, extend_to: int | None) -> list[int]:
    from harness.benchmark.gsm8k.protocol import extension_plan

    asked = [p.index for p in plan.prompts]
    more = extension_plan(data, plan, (extend_to or 0) - len(asked))
    return asked + ([p.index for p in more.prompts] if more else [])


def play_trial(inputs: RunInputs, data, scenario: Scenario, seed: int, dropped: dict[str, float] | None = None
               ) -> tuple[dict, dict]:
    """(first night's verdicts, second night's verdicts) of one trial."""
    questions = questions_of(data, inputs.plan, inputs.loaded.suite.gate.extend_to)
    dropped = dropped if dropped is not None else _dropped(inputs, scenario)
    answers = Answers(seed, questions, [p.index for p in inputs.plan.prompts], scenario, list(inputs.matrix.cells),
                      dropped)
    if scenario.calibration_nights:
        measured = []
        for number in range(scenario.calibration_nights):
            night = Night(inputs, answers, scenario, {}, judged=False, number=10 + number)
            night.play()
            measured.append((RunInfo(run_id=f"calibration-{number}", suite="s", config_path="", config_sha256="",
                                     engine="sim", harness_version="", protocol="", started_at=""), night.results))
        floors = {p.model: p.proposed for p in propose_floors(measured, {m.id: m.floor for m in
                                                                         inputs.loaded.suite.models})}
        inputs = with_floors(inputs, floors)
    first = Night(inputs, answers, scenario, {}, judged=False).play()
    history = {cell_id: outcome for cell_id, (status, outcome) in first.items()
               if status is Status.PASS and outcome is not None and cell_id not in dropped}
    second = Night(inputs, answers, scenario, history, judged=True, number=1).play()
    return first, second


def _dropped(inputs: RunInputs, scenario: Scenario) -> dict[str, float]:
    if not scenario.dropped_cell:
        return {}
    first_model = inputs.matrix.cells[0].model.id
    cell = next(c for c in inputs.matrix.cells if c.model.id == first_model and not c.is_reference)
    return {cell.cell_id: scenario.dropped_cell}


def calibration(data, suites: list[str], nights: int, chosen: list[int] | None = None, first_trial: int = 0) -> None:
    print(f"healthy nights ({nights} trials of two nights each; the second has the first as history)")
    print(f"  {'suite':<8} {'scenario':<24} {'any fail':>9} {'any fail (1st night)':>21} {'any inconclusive':>17}"
          f" {'extended':>9} {'dropped cell passed':>20}")
    for name in suites:
        for number, scenario in enumerate(SCENARIOS):
            if chosen is not None and number not in chosen:
                continue
            inputs = suite_inputs(name, data, scenario)
            dropped = _dropped(inputs, scenario)
            excluded = set(dropped)
            if scenario.broken_reference:  # that reference is broken: its own fail is right, not a false alarm
                first_model = inputs.matrix.cells[0].model.id
                excluded |= {c.cell_id for c in inputs.matrix.cells if c.model.id == first_model and c.is_reference}
            fails = first_fails = undecided = extended = dropped_passed = 0
            for trial in range(first_trial, first_trial + nights):
                first, second = play_trial(inputs, data, scenario, seed=trial * 7919 + number)
                healthy = {k: v for k, v in second.items() if k not in excluded}
                fails += any(status is Status.FAIL for status, _ in healthy.values())
                first_fails += any(s is Status.FAIL for k, (s, _) in first.items() if k not in excluded)
                undecided += any(status is Status.INCONCLUSIVE for status, _ in healthy.values())
                extended += any(o is not None and len(o.questions) > len(inputs.plan.prompts)
                                for _, o in second.values())
                dropped_passed += any(second[k][0] is Status.PASS for k in dropped)
            cells = len(inputs.matrix.cells)
            print(f"  {name + f' {cells}':<8} {scenario.name:<24} {fails / nights:>9.1%} {first_fails / nights:>21.1%} "
                  f"{undecided / nights:>17.1%} {extended / nights:>9.0%} "
                  f"{(f'{dropped_passed} of {nights}' if dropped else '-'):>20}", flush=True)


def power(data, trials: int) -> None:
    print(f"power: one nightly cell loses 3 points ({trials} trials each; fail = caught)")
    print(f"  {'agreement':>9} {'with history':>13} {'first night':>12} {'inconclusive':>13}")
    for agreement in (0.95, 0.98):
        scenario = Scenario("power", agreement=agreement)
        inputs = suite_inputs("nightly", data, scenario)
        target = next(c for c in inputs.matrix.cells if not c.is_reference)
        caught = first_caught = undecided = 0
        for trial in range(trials):
            # The drop arrives on the second night: the first night is the cell's healthy history.
            questions = questions_of(data, inputs.plan, inputs.loaded.suite.gate.extend_to)
            planned = [p.index for p in inputs.plan.prompts]
            healthy = Answers(trial, questions, planned, scenario, list(inputs.matrix.cells), {})
            first = Night(inputs, healthy, scenario, {}, judged=False).play()
            history = {k: o for k, (s, o) in first.items() if s is Status.PASS and o is not None}
            broken = Answers(trial, questions, planned, scenario, list(inputs.matrix.cells), {target.cell_id: 0.03})
            second = Night(inputs, broken, scenario, history, judged=False, number=1).play()
            alone = Night(inputs, broken, scenario, {}, judged=False, number=1).play()
            caught += second[target.cell_id][0] is Status.FAIL
            undecided += second[target.cell_id][0] is Status.INCONCLUSIVE
            first_caught += alone[target.cell_id][0] is Status.FAIL
        print(f"  {agreement:>9.2f} {caught / trials:>13.1%} {first_caught / trials:>12.1%} "
              f"{undecided / trials:>13.1%}", flush=True)


def early_stop(data) -> None:
    """The incident's cells (accuracy 0.06-0.34) on the nightly and the demo, broken answers last."""
    for name in ("demo", "nightly"):
        inputs = suite_inputs(name, data, Scenario("incident", floor_below=0.05))
        rule_alpha = run_budget(inputs).early_stop
        planned = list(inputs.plan.test_indices())  # what the looks see
        decided = []
        for strength in (0.66, 0.80, 0.94):
            rng = random.Random(int(strength * 100))
            right = {i: rng.random() < ACCURACY * (1 - strength) for i in planned}
            arrival = sorted(planned, key=lambda i: not right[i])  # right answers first, junk last
            looks = Looks(EarlyStop(ACCURACY - 0.05, len(planned), rule_alpha, order=tuple(planned)))
            for count, i in enumerate(arrival, start=1):
                reason = looks.add(record(i, right[i]))
                if reason:
                    decided.append((int(reason.split("first ")[1].split(" ")[0]), count))
                    break
        print(f"early stop ({name}, {rule_alpha:.2g} per cell over its looks): incident cells decided at the look "
              f"after (look, answers back) = {decided}; first look at 20 of {len(planned)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=200)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--suites", default="demo,nightly")
    parser.add_argument("--only", default="calibration,power,early-stop")
    parser.add_argument("--scenarios", default=None, help="Scenario numbers to play (0-based, comma-separated)")
    parser.add_argument("--first-trial", type=int, default=0, help="Start at this trial (more nights, other seeds)")
    args = parser.parse_args()
    data = load_gsm8k()
    parts = args.only.split(",")
    if "early-stop" in parts:
        early_stop(data)
    if "calibration" in parts:
        chosen = [int(n) for n in args.scenarios.split(",")] if args.scenarios else None
        calibration(data, args.suites.split(","), args.nights, chosen, args.first_trial)
    if "power" in parts:
        power(data, args.trials)


if __name__ == "__main__":
    main()
