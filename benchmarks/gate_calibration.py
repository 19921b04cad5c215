"""Does the gate cry wolf, does it sleep, and does a pass mean what it says? Nights of the shipped
suites (configs/nightly.yaml: 72 cells, 2,638 questions; configs/pr.yaml: 9 cells, 400 questions,
extended to 1,319) played through the product's own gating (`Gating`: early stop, the budget, both
stages, `extend`), with answers drawn from a model of real servers instead of Ray and HTTP.

    .venv/bin/python benchmarks/gate_calibration.py [--trials 400] [--suites nightly,pr] [--only ...]
    .venv/bin/python benchmarks/gate_calibration.py --quick      # what the test suite runs

The answer model (an item-response model, per model of the suite):
- each question has a difficulty: the chance p_q that a launch answers it right, drawn from
  Beta(0.9, 0.1) (most questions easy, some impossible, a few in between), so the model's true
  accuracy is the mean of p_q over the test split (about 0.90);
- the model has one typical answer per question (right with chance p_q); each cell (a configuration)
  redraws 16.8% of them once, for good; each launch (a night) redraws 15% of its cell's: two healthy
  cells then disagree on 4.5% of questions, a cell and its previous night on 2.5%;
- a real offset or bug of d points (a cell's, fixed) makes a share d / accuracy of its right answers
  wrong (or of its wrong answers right); a launch-level shift is drawn afresh for every launch.

Every healthy cell carries a fixed backend offset drawn from N(0, 0.5 points) (inside the suites'
1.5-point tolerance); floors are the model's accuracy minus gate.floor_margin, as the shipped suites
derive them. A trial plays a first night (no history) and a second night with the first as its
history (and its pin): both are counted. Scenarios:

- healthy: as above;
- launch spread: each launch also moves by N(0, 0.5 points), the suite's launch_sd set to it (as
  `regress calibrate` measures it); and the same with launch_sd left at 0;
- build shift: on the second night a new build lowers every cell of the first model (its reference
  too) by 1.0 point: inside the tolerance, harmless by the gate's own definition;
- least favourable: every non-reference cell exactly `tolerance` under its reference and its model's
  floor exactly at the cells' accuracy: the false-fail rate the budget promises (<= alpha);
- model-wide break: on a first night the first model's reference and cells all lose 10 points;
- 2- and 3-point drops: one cell of the first model, on the second night (with history) and alone
  on a first night: how often it passes;
- drift: the first model (its reference too) loses 0.5 points a night from night 1 on, 10 nights,
  with `pinned_run: auto` and without a pin: the night it first turns red.

Every rate comes with its exact 95% interval (Clopper-Pearson). The exact size of the margin test is
computed beside Tango's score test (the chance each rejects at a run's tiny alpha, summed over every
outcome of the counts): `--only size`. Early stop: the incident's cells, their broken answers
returned last: `--only early-stop`.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from scipy.stats import binom, binomtest, norm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.benchmark.base import ProtocolPlan  # noqa: E402
from harness.benchmark.gsm8k.dataset import load_gsm8k  # noqa: E402
from harness.benchmark.gsm8k.protocol import EXTENSION_INDEX_OFFSET, build_plan, extension_plan  # noqa: E402
from harness.benchmark.scoring import score  # noqa: E402
from harness.gate.sequential import EarlyStop, Looks  # noqa: E402
from harness.gate.stats import _tango_z, drop_above_margin_p  # noqa: E402
from harness.records import CellOutcome, QuestionRecord, Status  # noqa: E402
from harness.results.sinks import Sinks  # noqa: E402
from harness.run.build import RunInputs  # noqa: E402
from harness.run.extension import extend  # noqa: E402
from harness.run.gating import Gating  # noqa: E402
from harness.run.history import BASELINE_STATUSES  # noqa: E402
from harness.run.pipeline import run_budget  # noqa: E402
from harness.suite.config import load_suite  # noqa: E402
from harness.suite.matrix import Cell, Matrix, expand  # noqa: E402

QUIET = Console(quiet=True)
DIFFICULTY = (0.9, 0.1)  # Beta parameters of p_q
CELL_REDRAW = 0.168  # 1 - (1 - 0.168)(1 - 0.15) = 0.293: two cells disagree on 1 - (1 - 0.293)^2 = 50% of E[2p(1-p)] = 9%
NIGHT_REDRAW = 0.15  # a cell's two nights: 1 - 0.85^2 = 27.8% of 9% = 2.5%
OFFSET_SD = 0.005


@dataclass(frozen=True)
class Scenario:
    name: str
    offsets: bool = True  # healthy cells carry fixed backend offsets N(0, OFFSET_SD)
    launch_sd: float = 0.0  # each launch moves by N(0, launch_sd)
    launch_sd_known: bool = True  # the suite's models carry launch_sd (as `regress calibrate` measures it)
    at_tolerance: bool = False  # least favourable: every non-reference cell exactly `tolerance` down, floor at it
    second_night_shift: float = 0.0  # the first model, reference included, on the judged night
    first_night_shift: float = 0.0  # the first model, reference included, on the first night
    dropped: float = 0.0  # one cell of the first model, from the judged night on
    drift: float = 0.0  # the first model loses this much a night from night 1 on
    pinned: bool = True  # gate.pinned_run auto (else none)


@dataclass
class Model:
    """One model's questions: difficulty and its typical answers, in `questions` order."""

    p: np.ndarray
    typical: np.ndarray
    accuracy: float  # the mean of p over the test split: the model's true accuracy


@dataclass
class World:
    seed: int
    questions: list[int]
    models: dict[str, Model]
    offsets: dict[str, float] = field(default_factory=dict)  # cell -> fixed offset (points as a fraction)

    @classmethod
    def draw(cls, seed: int, questions: list[int], inputs: RunInputs, scenario: Scenario,
             exact: frozenset[str] = frozenset()) -> World:
        """`exact`: cells with no backend offset (a dropped cell's true drop is then exactly its drop)."""
        rng = np.random.default_rng(seed)
        test = np.array([q < EXTENSION_INDEX_OFFSET for q in questions])
        models = {}
        for model in inputs.loaded.suite.models:
            p = rng.beta(*DIFFICULTY, size=len(questions))
            models[model.id] = Model(p=p, typical=rng.random(len(questions)) < p, accuracy=float(p[test].mean()))
        world = cls(seed, questions, models)
        tolerance = inputs.loaded.suite.gate.tolerance
        for cell in inputs.matrix.cells:
            if cell.is_reference or cell.cell_id in exact:
                offset = 0.0
            elif scenario.at_tolerance:
                offset = -tolerance
            else:
                offset = float(rng.normal(0, OFFSET_SD)) if scenario.offsets else 0.0
            world.offsets[cell.cell_id] = offset
        return world

    def answers(self, cell: Cell, night: int, shift: float, launch_sd: float) -> np.ndarray:
        """Night `night`'s answers of `cell` to every question: its configuration's fixed redraws and
        offset, this launch's redraws and shift (`shift` plus N(0, launch_sd))."""
        model = self.models[cell.model.id]
        size = len(self.questions)
        mine = np.random.default_rng([self.seed, zlib.crc32(cell.cell_id.encode())])
        answers = np.where(mine.random(size) < CELL_REDRAW, mine.random(size) < model.p, model.typical)
        answers = _shifted(answers, self.offsets[cell.cell_id], mine.random(size), model.accuracy)
        launch = np.random.default_rng([self.seed, zlib.crc32(cell.cell_id.encode()), night + 1])
        answers = np.where(launch.random(size) < NIGHT_REDRAW, launch.random(size) < model.p, answers)
        moved = shift + (float(launch.normal(0, launch_sd)) if launch_sd else 0.0)
        return _shifted(answers, moved, launch.random(size), model.accuracy)


def _shifted(answers: np.ndarray, shift: float, draws: np.ndarray, accuracy: float) -> np.ndarray:
    """Answers moved by `shift` in expectation: a share of the right ones made wrong, or of the wrong ones right."""
    if shift < 0:
        return answers & ~(draws < -shift / accuracy)
    if shift > 0:
        return answers | (draws < shift / (1 - accuracy))
    return answers


RECORDS: dict[tuple[int, bool], QuestionRecord] = {}


def record(index: int, correct: bool) -> QuestionRecord:
    """One answer (shared between cells: records are never changed once made)."""
    key = (index, correct)
    if key not in RECORDS:
        RECORDS[key] = QuestionRecord.model_construct(
            index=index, prompt_sha="", gold="1", pred="1" if correct else "2", pred_strict=None, correct=correct,
            correct_strict=correct, finish_reason="stop", output="", latency_s=0.0, output_tokens=1, attempts=1,
            error=None, teacher=None)
    return RECORDS[key]


class MemoryHistory:
    """Earlier nights as `History` reads them back: each cell's last answers that were not a
    regression, and the pin (the first night that was not red, with `pinned_run: auto`)."""

    def __init__(self, pinning: bool) -> None:
        self.pinning = pinning
        self.last: dict[str, tuple[str, CellOutcome]] = {}
        self.pin: dict[str, tuple[str, CellOutcome]] | None = None

    def baseline(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        return self.last.get(cell_id)

    def pinned(self, cell_id: str) -> tuple[str, CellOutcome] | None:
        return self.pin.get(cell_id) if self.pin else None

    def remember(self, night: int, verdicts: dict[str, tuple[Status, CellOutcome | None]]) -> None:
        name = f"night-{night}"
        for cell_id, (status, outcome) in verdicts.items():
            if status in BASELINE_STATUSES and outcome is not None:
                self.last[cell_id] = (name, outcome)
        if self.pinning and self.pin is None and not any(s.is_regression for s, _ in verdicts.values()):
            self.pin = {cell_id: (name, outcome) for cell_id, (status, outcome) in verdicts.items()
                        if status in BASELINE_STATUSES and outcome is not None}


@dataclass
class Night:
    """One night of a suite, played through the product's gating and extension."""

    inputs: RunInputs
    world: World
    number: int
    shifts: dict[str, float]  # cell -> this launch's shift
    launch_sd: float

    def play(self, history: MemoryHistory | None) -> dict[str, tuple[Status, CellOutcome | None]]:
        cells = list(self.inputs.matrix.cells)
        self.position = {q: i for i, q in enumerate(self.world.questions)}
        self.tonight = {c.cell_id: self.world.answers(c, self.number, self.shifts.get(c.cell_id, 0.0), self.launch_sd)
                        for c in cells}
        budget = run_budget(self.inputs)
        self.early_stop = budget.early_stop
        gating = Gating(self.inputs.loaded.suite.gate, budget, "fp", history or MemoryHistory(False), Sinks([]))
        self.schedule(cells, self.inputs.plan, lambda cell, outcome, log, console: gating.offer(cell, outcome, log))
        extend(self.inputs, gating, self.schedule)
        gating.release_waiting()
        return {cell_id: (result.status, gating.answers(cell_id)) for cell_id, result in gating.results().items()}

    def schedule(self, cells: list[Cell], plan: ProtocolPlan, on_outcome: Callable, label: str = "") -> None:
        main = plan is self.inputs.plan
        for cell in cells:
            answers = self.tonight[cell.cell_id]
            records = [record(p.index, bool(answers[self.position[p.index]])) for p in plan.prompts]
            stopped = None
            if main and self.early_stop > 0 and cell.model.floor > 0:  # as CellJobs builds it: test questions
                test = [r for r in records if r.is_test]
                rule = EarlyStop(cell.model.floor, len(test), self.early_stop, order=tuple(r.index for r in test))
                for look, _ in rule.thresholds:
                    stopped = rule.test_look(look, test[:look])
                    if stopped:
                        records = test[:look]
                        break
            on_outcome(cell, CellOutcome(cell_id=cell.cell_id, args=[], score=score(records, 1.0), questions=records,
                                         stopped_early=stopped), "", QUIET)


@dataclass
class Suite:
    """A shipped suite, its questions, and its models' floors set from one world's accuracies."""

    name: str
    inputs: RunInputs
    questions: list[int]

    @classmethod
    def load(cls, name: str, data) -> Suite:
        loaded = load_suite(ROOT / "configs" / f"{name}.yaml")
        spec = loaded.suite
        plan = build_plan(data, spec.protocol, spec.num_questions, spec.seed, spec.max_tokens)
        asked = [p.index for p in plan.prompts]
        more = extension_plan(data, plan, (spec.gate.extend_to or 0) - len(asked))
        questions = asked + ([p.index for p in more.prompts] if more else [])
        return cls(name, RunInputs(loaded, Matrix(expand(spec).cells), data, plan), questions)

    def configured(self, world: World, scenario: Scenario) -> RunInputs:
        """This suite with its models' accuracy (hence floor) and launch_sd as the scenario's world has them."""
        spec = self.inputs.loaded.suite
        margin = spec.gate.floor_margin
        models = []
        for model in spec.models:
            accuracy = world.models[model.id].accuracy
            floor = accuracy - spec.gate.tolerance if scenario.at_tolerance else accuracy - margin
            models.append(model.model_copy(update={
                "accuracy": accuracy, "floor": round(max(floor, 0.0), 4),
                "launch_sd": scenario.launch_sd if scenario.launch_sd_known else 0.0}))
        gate = spec.gate.model_copy(update={"pinned_run": "auto" if scenario.pinned else None})
        spec = spec.model_copy(update={"models": models, "gate": gate})
        loaded = self.inputs.loaded.model_copy(update={"suite": spec})
        return RunInputs(loaded, Matrix(expand(spec).cells), self.inputs.data, self.inputs.plan)

    def first_model(self, inputs: RunInputs) -> str:
        return inputs.matrix.cells[0].model.id


def interval(events: int, trials: int) -> str:
    if trials == 0:
        return "-"
    ci = binomtest(events, trials).proportion_ci(method="exact")
    return f"{events / trials:.1%} [{ci.low * 100:.1f}, {ci.high * 100:.1f}] ({events}/{trials})"


def _any(verdicts: dict, status: Status, excluded: set[str] = frozenset()) -> bool:
    return any(s is status for cell_id, (s, _) in verdicts.items() if cell_id not in excluded)


def model_cells(inputs: RunInputs, model: str) -> list[str]:
    return [c.cell_id for c in inputs.matrix.cells if c.model.id == model]


def dropped_cell(inputs: RunInputs, model: str) -> str:
    return next(c.cell_id for c in inputs.matrix.cells if c.model.id == model and not c.is_reference)


def trial(suite: Suite, scenario: Scenario, seed: int) -> dict[str, bool]:
    """One trial's events (name -> happened)."""
    first_model = suite.first_model(suite.inputs)
    target = dropped_cell(suite.inputs, first_model)
    world = World.draw(seed, suite.questions, suite.inputs, scenario, frozenset({target}) if scenario.dropped else frozenset())
    inputs = suite.configured(world, scenario)
    mine = model_cells(inputs, first_model)
    events: dict[str, bool] = {}
    if scenario.drift:
        history = MemoryHistory(scenario.pinned)
        caught = None
        for night in range(10):
            shifts = {c: -scenario.drift * night for c in mine}
            verdicts = Night(inputs, world, night, shifts, scenario.launch_sd).play(history)
            if caught is None and _any(verdicts, Status.FAIL):
                caught = night
            history.remember(night, verdicts)
        events.update({f"caught by night {n}": caught is not None and caught <= n for n in (4, 5, 6, 8, 9)})
        return events
    first_shift = {c: scenario.first_night_shift for c in mine} if scenario.first_night_shift else {}
    first = Night(inputs, world, 0, first_shift, scenario.launch_sd).play(None)
    if scenario.first_night_shift:
        events["red"] = _any(first, Status.FAIL)
        return events
    history = MemoryHistory(scenario.pinned)
    history.remember(0, first)
    shifts = {c: scenario.second_night_shift for c in mine} if scenario.second_night_shift else {}
    if scenario.dropped:
        shifts[target] = -scenario.dropped
        second = Night(inputs, world, 1, shifts, scenario.launch_sd).play(history)
        alone = Night(inputs, world, 1, shifts, scenario.launch_sd).play(None)
        events["passed (with history)"] = second[target][0] is Status.PASS
        events["passed (first night)"] = alone[target][0] is Status.PASS
        events["caught (with history)"] = second[target][0] is Status.FAIL
        return events
    second = Night(inputs, world, 1, shifts, scenario.launch_sd).play(history)
    if not scenario.second_night_shift:
        events["red (first night)"] = _any(first, Status.FAIL)
    events["red (with history)"] = _any(second, Status.FAIL)
    events["green (with history)"] = all(s is Status.PASS for s, _ in second.values())
    events["green (first night)"] = all(s is Status.PASS for s, _ in first.values())
    return events


SCENARIOS = {
    "healthy": Scenario("healthy"),
    "launch spread, launch_sd known": Scenario("launch spread", launch_sd=0.005),
    "launch spread, launch_sd 0": Scenario("launch spread", launch_sd=0.005, launch_sd_known=False),
    "build shift 1 pt": Scenario("build shift", second_night_shift=-0.01),
    "least favourable": Scenario("least favourable", offsets=False, at_tolerance=True),
    "model-wide break 10 pts": Scenario("break", first_night_shift=-0.10),
    "3-pt drop": Scenario("3-pt drop", dropped=0.03),
    "2-pt drop": Scenario("2-pt drop", dropped=0.02),
    "drift 0.5 pt/night, pinned": Scenario("drift", drift=0.005),
    "drift 0.5 pt/night, no pin": Scenario("drift", drift=0.005, pinned=False),
}
FEWER = {"model-wide break 10 pts": 4, "3-pt drop": 2, "2-pt drop": 2, "drift 0.5 pt/night, pinned": 4,
         "drift 0.5 pt/night, no pin": 4}  # their claims need fewer trials (>= 95%, <= 5%): a quarter or half


def scenarios(data, suites: list[str], trials: int, chosen: list[str], console: Console) -> None:
    for name in suites:
        suite = Suite.load(name, data)
        console.print(f"[bold]{name}[/]: {len(suite.inputs.matrix.cells)} cells, {len(suite.inputs.plan.prompts)} "
                      f"questions (up to {len(suite.questions)})")
        for key in chosen:
            scenario = SCENARIOS[key]
            count = max(1, trials // FEWER.get(key, 1))
            totals: dict[str, int] = {}
            for number in range(count):
                seed = number * 7919 + zlib.crc32(key.encode()) % 1000
                for event, happened in trial(suite, scenario, seed).items():
                    totals[event] = totals.get(event, 0) + happened
            console.print(f"  {key}: " + "; ".join(f"{event} {interval(n, count)}" for event, n in totals.items()),
                          soft_wrap=True)


def size(console: Console, quick: bool) -> None:
    """The exact chance that the margin test and Tango's score test reject when the drop is exactly
    the margin, with few gains (where the score test's normal tail is too thin)."""
    cases = [(1319, 0.015, 0.0015, 1e-5)] if quick else [
        (n, margin, gain_rate, alpha) for n in (1319, 2638) for margin in (0.01, 0.015)
        for gain_rate in (0.0005, 0.0015, 0.005, 0.015) for alpha in (1e-6, 1e-5, 1e-4)]
    worst = {"exact": 0.0, "score": 0.0}
    console.print("size at the margin (the chance of rejecting / alpha; <= 1 keeps the budget):")
    for n, margin, gain_rate, alpha in cases:
        ratios = {}
        for name in worst:
            rejected = 0.0
            loss_rate = gain_rate + margin
            gains = np.arange(0, int(n * gain_rate + 12 * math.sqrt(n * gain_rate) + 10))
            losses = np.arange(0, int(n * loss_rate + 12 * math.sqrt(n * loss_rate) + 10))
            for g in gains:
                mass = binom.pmf(g, n, gain_rate) * binom.pmf(losses, n - g, loss_rate / (1 - gain_rate))
                for lost, m in zip(losses, mass, strict=True):
                    if m < 1e-14:
                        continue
                    p = (drop_above_margin_p(int(lost), int(g), n, margin) if name == "exact"
                         else float(norm.sf(_tango_z(float(lost), float(g), n, margin))))
                    rejected += m * (p < alpha)
            ratios[name] = rejected / alpha
            worst[name] = max(worst[name], ratios[name])
        console.print(f"  n {n}, margin {margin}, discordance {2 * gain_rate + margin:.4f}, alpha {alpha:g}: "
                      f"exact {ratios['exact']:.2f}, score {ratios['score']:.2f}")
    console.print(f"  worst of {len(cases)}: exact {worst['exact']:.2f}, score {worst['score']:.2f}")


def early_stop(data, console: Console) -> None:
    """The incident's cells (accuracy 0.06-0.34 of a 0.90 model) against a floor 5 points under the
    model, on the PR suite and the nightly, their broken answers returned last."""
    for name in ("pr", "nightly"):
        suite = Suite.load(name, data)
        rule_alpha = run_budget(suite.inputs).early_stop
        planned = list(suite.inputs.plan.test_indices())  # what the looks see
        decided = []
        for strength in (0.66, 0.80, 0.94):
            rng = random.Random(int(strength * 100))
            right = {i: rng.random() < 0.9 * (1 - strength) for i in planned}
            arrival = sorted(planned, key=lambda i: not right[i])  # right answers first, junk last
            looks = Looks(EarlyStop(0.85, len(planned), rule_alpha, order=tuple(planned)))
            for count, i in enumerate(arrival, start=1):
                reason = looks.add(record(i, right[i]))
                if reason:
                    decided.append((int(reason.split("first ")[1].split(" ")[0]), count))
                    break
        console.print(f"early stop ({name}, {rule_alpha:.2g} per cell over its looks): incident cells decided at the "
                      f"(look, answers back) = {decided}; first look at 20 of {len(planned)} test questions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--suites", default="pr,nightly")
    parser.add_argument("--only", default="size,early-stop,scenarios", help="size, early-stop, scenarios (comma-separated)")
    parser.add_argument("--scenarios", default=None, help="Scenario names to play (comma-separated; default all)")
    parser.add_argument("--quick", action="store_true", help="1 trial of each scenario on the PR suite, one size case")
    args = parser.parse_args()
    console = Console(width=200)
    parts = args.only.split(",")
    if "size" in parts:
        size(console, args.quick)
    if "early-stop" in parts:
        early_stop(load_gsm8k(), console)
    if "scenarios" in parts:
        chosen = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
        unknown = [key for key in chosen if key not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
        suites = ["pr"] if args.quick else args.suites.split(",")
        scenarios(load_gsm8k(), suites, 1 if args.quick else args.trials, chosen, console)


if __name__ == "__main__":
    main()
