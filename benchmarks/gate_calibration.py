"""Does the gate cry wolf, does it sleep, does a pass mean what it says, and does it decide? Nights
of the shipped suites (configs/nightly.yaml: 72 cells; configs/pr.yaml: 9 cells; both 2,638
questions, extended to 5,276, up to 3 launches, undecided_budget 0.8 and 1.0) played through the product's
own gating (`Gating`: early stop, the budget, every stage, `pipeline.decide`: extension, relaunches,
model-wide tests), with answers drawn from a model of real servers instead of Ray and HTTP.

    .venv/bin/python benchmarks/gate_calibration.py [--pr-trials 300] [--nightly-trials 100] [--only ...]
    .venv/bin/python benchmarks/gate_calibration.py --shard 0/2 --save a.json   # then --merge a.json b.json
    .venv/bin/python benchmarks/gate_calibration.py --quick      # what the test suite runs

The answer model (an item-response model, per model of the suite):
- each question has a difficulty: the chance p_q that a launch answers it right, drawn from
  Beta(acc, 1 - acc) around the model's shipped `accuracy` (most questions easy, some impossible, a
  few in between); the model's true accuracy is the mean of p_q over the test split;
- the model has one typical answer per question (right with chance p_q); each cell (a configuration)
  redraws 16.8% of them once, for good; each launch redraws 15% of its cell's: two healthy cells of
  a 0.9 model then disagree on about 4.5% of questions, two launches of a cell on about 2.5%;
- a real offset or bug of d points (a cell's, fixed) makes a share d / accuracy of its right answers
  wrong (or of its wrong answers right), the same questions on every launch, after the launch's
  redraws (so that every launch is d points off in expectation);
- every launch also moves by N(0, --launch-sd) (default 0.5 point: the fleet's launch spread), drawn
  afresh per launch; the suites' `launch_sd` (0.5 point) is only the gate's prior until it has
  measured the spread from the references' second launches.

Every healthy cell carries a fixed backend offset drawn from N(0, 0.5 points) (inside the suites'
1.5-point tolerance); floors are the model's accuracy minus gate.floor_margin, as the shipped suites
derive them. A trial plays a first night (no history), then 5 healthy warm-up nights (the history
pools up to 5), then the judged night(s) with that history and the first night as its pin.
Scenarios (SCENARIOS):

- healthy: as above; "first night" and "with history" are both counted;
- least favourable: every non-reference cell exactly `tolerance` under its reference and its model's
  floor exactly at the cells' accuracy: the false-fail rate the budget promises (<= alpha);
- build shift: a new build lowers every cell of the first model (its reference too) by 1.0 point:
  inside the history margin, harmless by the gate's own definition;
- model-wide break: on a first night the first model's reference and cells all lose 10 points;
- 3- and 5-point drops: one cell of the first model, alone on a first night, and from a night with
  history on (3 points: red within 1, 2, 3 nights);
- launch spread estimate: 15 healthy nights, then the spread as the gate and `regress calibrate`
  measure it, against the truth;
- drift: 0.5 point a night from night 1, of one cell or of the whole first model (its reference
  too), pinned to night 0: red by night 4, 5, 6.

Cost: a launch holds its GPUs for STARTUP_S (by GPUs) plus QUESTION_S a question (assumptions; only
ratios to one pass of the planned questions are reported). Every rate comes with its exact 95%
interval (Clopper-Pearson) and its count. The exact size of the margin test is computed beside
Tango's score test (the chance each rejects at a run's tiny alpha, summed over every outcome of the
counts): `--only size`. Early stop: the incident's cells, their broken answers returned last:
`--only early-stop`. The arithmetic of deciding a healthy cell under launch spread (how the green
rate moves with launches and questions, by the normal approximation), and the most any test could
catch the one-cell drift by night 6 with (Neyman-Pearson, every simplification in the test's favour:
`drift_bound`): `--only frontier`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from scipy.stats import binom, binomtest, norm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.analysis.calibrate import (  # noqa: E402
    night_to_night_pairs,
    propose_launch_spread,
    propose_launch_spread_within,
)
from harness.benchmark.base import ProtocolPlan  # noqa: E402
from harness.benchmark.gsm8k.dataset import load_gsm8k  # noqa: E402
from harness.benchmark.gsm8k.protocol import EXTENSION_INDEX_OFFSET, build_plan, extension_plan  # noqa: E402
from harness.benchmark.scoring import score  # noqa: E402
from harness.gate.sequential import EarlyStop, Looks  # noqa: E402
from harness.gate.stats import _tango_z, drop_above_margin_p  # noqa: E402
from harness.gate.verdict import pass_confidence_per_stage  # noqa: E402
from harness.records import (  # noqa: E402
    CellOutcome,
    CellResult,
    QuestionRecord,
    RunInfo,
    Status,
    Timings,
    status_counts,
)
from harness.results.sinks import Sinks  # noqa: E402
from harness.run.build import RunInputs  # noqa: E402
from harness.run.gating import Gating  # noqa: E402
from harness.run.history import History  # noqa: E402
from harness.run.pipeline import decide, extends, run_budget  # noqa: E402
from harness.suite.config import load_suite  # noqa: E402
from harness.suite.matrix import Cell, Matrix, expand  # noqa: E402

QUIET = Console(quiet=True)
CONCENTRATION = 1.0  # Beta(accuracy * c, (1 - accuracy) * c): most questions easy or impossible, some in between
CELL_REDRAW = 0.168  # a configuration's own answers: two healthy cells of a 0.9 model disagree on ~4.5% of questions
NIGHT_REDRAW = 0.15  # a launch's own answers: two launches of a cell of a 0.9 model disagree on ~2.5%
OFFSET_SD = 0.005  # each healthy cell's fixed backend offset from its reference
LAUNCH_SD = 0.005  # each launch's whole-launch shift (the fleet: half a point)
# What a launch costs in GPU-seconds (an assumption; only ratios are reported): the server's start
# (weights loaded, graphs captured) per GPU, and a question's share of the evaluation at 256 in flight.
STARTUP_S = {1: 150.0, 2: 300.0}
QUESTION_S = 0.1
WARMUP_NIGHTS = 5  # nights played before a "with history" night: the history test pools up to 5


@dataclass(frozen=True)
class Scenario:
    name: str
    offsets: bool = True  # healthy cells carry fixed backend offsets N(0, OFFSET_SD)
    at_tolerance: bool = False  # least favourable: every non-reference cell exactly `tolerance` down, floor at it
    shift: float = 0.0  # the first model, reference included, from the judged night on (build shift, break)
    first_night_only: bool = False  # the judged night is a first night (no history)
    dropped: float = 0.0  # one cell of the first model, from the judged night on
    drift: float = 0.0  # a drift a night, from night 1 on (pinned to night 0)
    drift_model_wide: bool = False  # the drift moves every cell of the first model (its reference too)
    nights_after: int = 1  # nights judged from the drop on (red within them)
    estimate_nights: int = 0  # healthy nights played, then launch spread as the gate and calibrate measure it


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
    launch_sd: float
    offsets: dict[str, float] = field(default_factory=dict)  # cell -> fixed offset (points as a fraction)

    @classmethod
    def draw(cls, seed: int, questions: list[int], inputs: RunInputs, scenario: Scenario, launch_sd: float,
             exact: frozenset[str] = frozenset()) -> World:
        """Each model's questions drawn around its shipped accuracy (the suite's `accuracy`); `exact`:
        cells with no backend offset (a dropped cell's true drop is then exactly its drop)."""
        rng = np.random.default_rng(seed)
        test = np.array([q < EXTENSION_INDEX_OFFSET for q in questions])
        models = {}
        for model in inputs.loaded.suite.models:
            mean = model.accuracy or 0.9
            p = rng.beta(mean * CONCENTRATION, (1 - mean) * CONCENTRATION, size=len(questions))
            models[model.id] = Model(p=p, typical=rng.random(len(questions)) < p, accuracy=float(p[test].mean()))
        world = cls(seed, questions, models, launch_sd)
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

    def answers(self, cell: Cell, night: int, launch: int, shift: float) -> np.ndarray:
        """Launch `launch` of night `night` of `cell`, every question: its configuration's fixed redraws,
        this launch's redraws, its configuration's fixed offset, this launch's shift (`shift` plus
        N(0, launch_sd)). The offset comes after the launch's redraws, so that every launch carries
        all of it: before them, a redrawn answer would undo it, and a cell set `tolerance` under its
        reference would sit 15% nearer to it."""
        model = self.models[cell.model.id]
        size = len(self.questions)
        offset = self.offsets[cell.cell_id]
        mine = np.random.default_rng([self.seed, zlib.crc32(cell.cell_id.encode())])
        answers = np.where(mine.random(size) < CELL_REDRAW, mine.random(size) < model.p, model.typical)
        broken = mine.random(size)  # which answers the offset moves: the same questions every launch
        this = np.random.default_rng([self.seed, zlib.crc32(cell.cell_id.encode()), night + 1, launch])
        answers = np.where(this.random(size) < NIGHT_REDRAW, this.random(size) < model.p, answers)
        answers = _shifted(answers, offset, broken, model.accuracy)
        moved = shift + (float(this.normal(0, self.launch_sd)) if self.launch_sd else 0.0)
        return _shifted(answers, moved, this.random(size), model.accuracy + offset)


def _shifted(answers: np.ndarray, shift: float, draws: np.ndarray, accuracy: float) -> np.ndarray:
    """Answers moved by `shift` in expectation: a share of the right ones made wrong, or of the wrong ones
    right (`accuracy`: the share of `answers` right in expectation)."""
    if shift < 0:
        return answers & ~(draws < -shift / accuracy)
    if shift > 0:
        return answers | (draws < shift / (1 - accuracy))
    return answers


RECORDS: dict[tuple[int, bool, int], QuestionRecord] = {}


def record(index: int, correct: bool, launch: int = 0) -> QuestionRecord:
    """One answer (shared between cells: records are never changed once made). Numbered with the
    launch the gate will give it (`Gating.relaunched` numbers a worker's answers; these need no copy)."""
    key = (index, correct, launch)
    if key not in RECORDS:
        RECORDS[key] = QuestionRecord.model_construct(
            index=index, split="test" if index < EXTENSION_INDEX_OFFSET else "train", prompt_sha="", gold="1",
            pred="1" if correct else "2", pred_strict=None, correct=correct, correct_strict=correct,
            finish_reason="stop", output="", latency_s=0.0, output_tokens=1, attempts=1, error=None, teacher=None,
            cached_tokens=None, launch=launch)
    return RECORDS[key]


class MemoryArchive:
    """Earlier nights as the product's `History` reads them (a `RunArchive` in memory): run.json,
    cells.jsonl and every cell's questions, as `regress run` would have written them."""

    def __init__(self) -> None:
        self.infos: list[RunInfo] = []
        self.results: dict[str, list[CellResult]] = {}
        self.answers: dict[tuple[str, str], list[QuestionRecord]] = {}

    def runs(self, suite: str) -> list[RunInfo]:
        return list(self.infos)

    def cells(self, run_id: str) -> list[CellResult]:
        return self.results.get(run_id, [])

    def questions(self, run_id: str, cell_id: str) -> list[QuestionRecord]:
        return self.answers.get((run_id, cell_id), [])

    def remember(self, night: int, gating: Gating) -> None:
        run_id = f"night-{night:02d}"
        results = list(gating.results().values())
        self.infos.append(RunInfo(run_id=run_id, suite="bench", config_path="", config_sha256="", engine="sim",
                                  harness_version="0", protocol="clean", protocol_fingerprint="fp",
                                  started_at=f"2026-01-01T00:{night:02d}:00", ended_at=f"2026-01-01T00:{night:02d}:30",
                                  counts=status_counts(results)))
        self.results[run_id] = results
        for result in results:
            outcome = gating.answers(result.cell_id)
            if outcome is not None:
                self.answers[(run_id, result.cell_id)] = list(outcome.questions)


@dataclass
class Night:
    """One night of a suite, played through the product's gating, extension and relaunches."""

    inputs: RunInputs
    world: World
    number: int
    shifts: dict[str, float]  # cell -> this night's true shift (a drop, a build shift, a drift)
    cost_s: float = 0.0  # GPU-seconds the night's launches took (STARTUP_S, QUESTION_S)
    launches: dict[str, int] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)  # cell -> the launch number its last answers carry

    def play(self, archive: MemoryArchive | None) -> Gating:
        cells = list(self.inputs.matrix.cells)
        self.position = {q: i for i, q in enumerate(self.world.questions)}
        budget = run_budget(self.inputs)
        self.early_stop = budget.early_stop
        gate = self.inputs.loaded.suite.gate
        history = History.of(archive or MemoryArchive(), "bench", "fp", "tonight", gate.pinned_run, gate.history_runs)
        gating = Gating(gate, budget, "fp", history, Sinks([]), extends=extends(self.inputs))
        self.schedule(cells, self.inputs.plan, lambda cell, outcome, log, console: gating.offer(cell, outcome, log))
        decide(self.inputs, gating, self.schedule)
        gating.release_waiting()
        return gating

    def schedule(self, cells: list[Cell], plan: ProtocolPlan, on_outcome: Callable, label: str = "",
                 looks: bool = True) -> None:
        """Every cell launched once on `plan` (a launch starts a server: the extension too)."""
        main = plan.prompts[:1] == self.inputs.plan.prompts[:1]  # the planned questions (a relaunch: and more)
        for cell in cells:
            if main:
                self.launches[cell.cell_id] = self.launches.get(cell.cell_id, -1) + 1
            launch = self.launches.get(cell.cell_id, 0) + (0 if main else 100)  # the extension: a launch of its own
            answers = self.world.answers(cell, self.number, launch, self.shifts.get(cell.cell_id, 0.0))
            number = self.numbers.get(cell.cell_id, -1) + 1 if (not main or self.launches[cell.cell_id]) else 0
            self.numbers[cell.cell_id] = number
            records = [record(p.index, bool(answers[self.position[p.index]]), number) for p in plan.prompts]
            held = launch_s(cell, len(records))
            self.cost_s += cell.gpus * held
            stopped = None
            if main and looks and self.early_stop > 0 and cell.model.floor > 0:  # as CellJobs builds it
                test = [r for r in records if r.is_test]
                rule = EarlyStop(cell.model.floor, len(test), self.early_stop, order=tuple(r.index for r in test))
                for look, _ in rule.thresholds:
                    stopped = rule.test_look(look, test[:look])
                    if stopped:
                        records = test[:look]
                        break
            if stopped:
                held = launch_s(cell, len(records))
            timings = Timings(startup_s=held - QUESTION_S * len(records), eval_s=QUESTION_S * len(records),
                              started_at=0.0, ended_at=held)
            on_outcome(cell, CellOutcome(cell_id=cell.cell_id, args=[], score=score(records, 1.0), questions=records,
                                         stopped_early=stopped, timings=timings), "", QUIET)


@dataclass
class Suite:
    """A shipped suite and its questions (the planned ones, then the extension's)."""

    name: str
    inputs: RunInputs
    questions: list[int]

    @classmethod
    def load(cls, name: str, data, overrides: dict | None = None) -> Suite:
        """The shipped suite; `overrides`: gate settings by name, suite settings as `suite.KEY`."""
        loaded = load_suite(ROOT / "configs" / f"{name}.yaml")
        if overrides:
            gate = loaded.suite.gate.model_copy(update={k: v for k, v in overrides.items() if "." not in k})
            spec = loaded.suite.model_copy(update={"gate": gate, **{k.split(".", 1)[1]: v for k, v in overrides.items()
                                                                   if k.startswith("suite.")}})
            loaded = loaded.model_copy(update={"suite": spec})
        spec = loaded.suite
        plan = build_plan(data, spec.protocol, spec.num_questions, spec.seed, spec.max_tokens)
        asked = [p.index for p in plan.prompts]
        more = extension_plan(data, plan, (spec.gate.extend_to or 0) - len(asked))
        questions = asked + ([p.index for p in more.prompts] if more else [])
        return cls(name, RunInputs(loaded, Matrix(expand(spec).cells), data, plan), questions)

    def configured(self, scenario: Scenario, world: World) -> RunInputs:
        """The suite as shipped (floors from its models' shipped accuracies), or for the least favourable
        scenario with each floor exactly at its cells' true accuracy: the world's drawn accuracy minus
        the tolerance. The drawn accuracy has an sd of about 0.6 (Kimi-Linear) and 0.9 point
        (DeepSeek-V2-Lite) around the shipped one, so a floor from the shipped accuracy puts some
        worlds' cells truly under it, and their `fail`s are right, not false."""
        if not scenario.at_tolerance:
            return self.inputs
        spec = self.inputs.loaded.suite
        models = [model.model_copy(update={"floor": world.models[model.id].accuracy - spec.gate.tolerance})
                  for model in spec.models]
        spec = spec.model_copy(update={"models": models})
        loaded = self.inputs.loaded.model_copy(update={"suite": spec})
        return RunInputs(loaded, Matrix(expand(spec).cells), self.inputs.data, self.inputs.plan)

    def first_model(self) -> str:
        return self.inputs.matrix.cells[0].model.id


def interval(events: int, trials: int) -> str:
    if trials == 0:
        return "-"
    ci = binomtest(events, trials).proportion_ci(method="exact")
    return f"{events / trials:.1%} [{ci.low * 100:.1f}, {ci.high * 100:.1f}] ({events}/{trials})"


def statuses(gating: Gating) -> dict[str, Status]:
    return {cell_id: result.status for cell_id, result in gating.results().items()}


def model_cells(inputs: RunInputs, model: str) -> list[str]:
    return [c.cell_id for c in inputs.matrix.cells if c.model.id == model]


def dropped_cell(inputs: RunInputs, model: str) -> str:
    return next(c.cell_id for c in inputs.matrix.cells if c.model.id == model and not c.is_reference)


@dataclass
class Outcome:
    """What one trial measured: events (name -> happened) and figures (name -> value)."""

    events: dict[str, bool] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)


def _night_events(outcome: Outcome, label: str, night: Night, gating: Gating, first_model: str) -> None:
    verdicts = statuses(gating)
    outcome.events[f"red ({label})"] = any(s.is_regression for s in verdicts.values())
    outcome.events[f"green ({label})"] = all(s in (Status.PASS, Status.SKIPPED) for s in verdicts.values())
    outcome.events[f"undecided ({label})"] = (not outcome.events[f"red ({label})"]
                                             and any(s is Status.INCONCLUSIVE for s in verdicts.values()))
    outcome.figures[f"GPU-s ({label})"] = night.cost_s
    spread = gating.spread(first_model)
    if spread is not None:
        outcome.figures[f"launch_sd measured ({label})"] = spread.sd


# The warm-up nights of the trial being played, shared by the scenarios that start from them
# (healthy, least favourable aside, and the drops): (suite, seed, launch_sd) -> (archive, night 0).
WARMED: dict[tuple, tuple[MemoryArchive, Outcome]] = {}


def warmed_up(suite: Suite, inputs: RunInputs, world: World, key: tuple) -> tuple[MemoryArchive, Outcome]:
    """WARMUP_NIGHTS healthy nights played once per trial seed; each scenario branches off a copy."""
    if key not in WARMED:
        WARMED.clear()  # trials run one seed at a time: keep only this one's
        archive, first = MemoryArchive(), Outcome()
        for number in range(WARMUP_NIGHTS):
            night = Night(inputs, world, number, {})
            gating = night.play(archive)
            if number == 0:
                _night_events(first, "first night", night, gating, suite.first_model())
            archive.remember(number, gating)
        WARMED[key] = (archive, first)
    archive, first = WARMED[key]
    copy = MemoryArchive()
    copy.infos, copy.results, copy.answers = list(archive.infos), dict(archive.results), dict(archive.answers)
    return copy, first


def trial(suite: Suite, scenario: Scenario, seed: int, launch_sd: float) -> Outcome:
    """One trial: a first night, or warm-up nights then the judged nights (module docstring). The
    scenarios that play the same warm-up (every cell's offset drawn, the dropped cell's exactly 0)
    share it for one seed."""
    first_model = suite.first_model()
    target = dropped_cell(suite.inputs, first_model)
    shares_warmup = not (scenario.at_tolerance or scenario.estimate_nights or scenario.drift or scenario.first_night_only)
    world = World.draw(seed, suite.questions, suite.inputs, scenario, launch_sd,
                       frozenset({target}) if scenario.dropped or shares_warmup else frozenset())
    inputs = suite.configured(scenario, world)  # the world first: a least favourable floor follows its accuracy
    mine = model_cells(inputs, first_model)
    outcome = Outcome()
    if scenario.estimate_nights:
        archive = MemoryArchive()
        for number in range(scenario.estimate_nights):
            gating = Night(inputs, world, number, {}).play(archive)
            archive.remember(number, gating)
        runs = [(info, archive.cells(info.run_id)) for info in archive.infos[-14:]]
        within = {found.model: found.estimate.sd for found in propose_launch_spread_within(runs)}
        night = {found.model: found.launch_sd for found in
                 propose_launch_spread(night_to_night_pairs(archive, runs, "flexible"))}
        for model in world.models:
            spread = gating.spread(model)
            if spread is not None:
                outcome.figures[f"launch_sd, the gate ({model}, night {scenario.estimate_nights})"] = spread.sd
            if model in within:
                outcome.figures[f"launch_sd, calibrate within runs ({model}, 14 runs)"] = within[model]
            if model in night:
                outcome.figures[f"launch_sd, calibrate night to night ({model}, 14 runs)"] = night[model]
        return outcome
    if scenario.drift:
        archive, caught = MemoryArchive(), None
        drifting = mine if scenario.drift_model_wide else [target]
        for number in range(7):  # nights 0 (the pin) to 6
            night = Night(inputs, world, number, {c: -scenario.drift * number for c in drifting})
            gating = night.play(archive)
            if caught is None and any(s.is_regression for s in statuses(gating).values()):
                caught = number
            archive.remember(number, gating)
        outcome.events.update({f"red by night {n}": caught is not None and caught <= n for n in (4, 5, 6)})
        return outcome
    shifts = {c: scenario.shift for c in mine} if scenario.shift else {}
    if scenario.dropped:
        shifts[target] = -scenario.dropped
    if scenario.first_night_only:
        night = Night(inputs, world, 0, shifts)
        gating = night.play(None)
        _night_events(outcome, "first night", night, gating, first_model)
        if scenario.dropped:
            outcome.events["dropped cell passed (first night)"] = gating.results()[target].status is Status.PASS
            outcome.events["dropped cell red (first night)"] = gating.results()[target].status.is_regression
        return outcome
    if shares_warmup:
        archive, first = warmed_up(suite, inputs, world, (suite.name, seed, launch_sd))
    else:
        archive, first = MemoryArchive(), Outcome()
        for number in range(WARMUP_NIGHTS):
            night = Night(inputs, world, number, {})
            gating = night.play(archive)
            if number == 0:
                _night_events(first, "first night", night, gating, first_model)
            archive.remember(number, gating)
    if not scenario.shift and not scenario.dropped:
        outcome.events.update(first.events)
        outcome.figures.update(first.figures)
    red_by = None
    for after in range(scenario.nights_after):
        number = WARMUP_NIGHTS + after
        night = Night(inputs, world, number, shifts)
        gating = night.play(archive)
        if after == 0:
            _night_events(outcome, "with history", night, gating, first_model)
            if scenario.dropped:
                outcome.events["dropped cell passed (its first night)"] = gating.results()[target].status is Status.PASS
        if red_by is None and any(s.is_regression for s in statuses(gating).values()):
            red_by = after + 1
        archive.remember(number, gating)
    if scenario.nights_after > 1:
        outcome.events.update({f"red within {n} night(s)": red_by is not None and red_by <= n
                               for n in range(1, scenario.nights_after + 1)})
    return outcome


SCENARIOS = {
    "healthy": Scenario("healthy"),
    "least favourable": Scenario("least favourable", offsets=False, at_tolerance=True),
    "build shift 1 pt": Scenario("build shift", shift=-0.01),
    "model-wide break 10 pts": Scenario("break", shift=-0.10, first_night_only=True),
    "3-pt drop": Scenario("3-pt drop", dropped=0.03, nights_after=3),
    "3-pt drop (first night)": Scenario("3-pt drop", dropped=0.03, first_night_only=True),
    "5-pt drop": Scenario("5-pt drop", dropped=0.05),
    "5-pt drop (first night)": Scenario("5-pt drop", dropped=0.05, first_night_only=True),
    "launch spread estimate": Scenario("estimate", estimate_nights=15),
    "drift 0.5 pt/night (one cell)": Scenario("drift", drift=0.005),
    "drift 0.5 pt/night (model-wide)": Scenario("drift", drift=0.005, drift_model_wide=True),
}
SHARED_WARMUP = {key for key, scenario in SCENARIOS.items()
                 if not (scenario.at_tolerance or scenario.estimate_nights or scenario.drift or scenario.first_night_only)}
FEWER = {"model-wide break 10 pts": 4, "launch spread estimate": 3}  # fewer trials: a claim of >= 95%, or figures


def launch_s(cell: Cell, questions: int) -> float:
    """Seconds a launch of `cell` holds its GPUs: its server's start, then its questions."""
    return STARTUP_S.get(cell.gpus, 150.0 * cell.gpus) + QUESTION_S * questions


def today_cost(suite: Suite) -> float:
    """GPU-seconds of one pass of the matrix: every cell launched once on the planned questions."""
    return sum(cell.gpus * launch_s(cell, len(suite.inputs.plan.prompts)) for cell in suite.inputs.matrix.cells)


def scenarios(data, suites: list[str], trials: dict[str, int], chosen: list[str], launch_sd: float,
              overrides: dict, console: Console, shard: tuple[int, int] = (0, 1), save: Path | None = None,
              first: int = 0) -> None:
    """Play the chosen scenarios; `shard` (i, n): only the trials whose number is i modulo n (run n
    processes, then `--merge` their `--save` files); `save`: the raw events and figures as JSON;
    `first`: the first trial's number (a later run adds trials with other seeds)."""
    raw: dict = {"launch_sd": launch_sd, "suites": {}}
    for name in suites:
        suite = Suite.load(name, data, overrides)
        base = today_cost(suite)
        gate = suite.inputs.loaded.suite.gate
        heading = (f"{name}: {len(suite.inputs.matrix.cells)} cells, {len(suite.inputs.plan.prompts)} questions (up to "
                   f"{len(suite.questions)}); launch spread {launch_sd * 100:g} pts; max_launches {gate.max_launches}, "
                   f"undecided_budget {gate.undecided_budget}, history_runs {gate.history_runs}; one planned pass "
                   f"{base:.0f} GPU-s")
        found_suite = raw["suites"][name] = {"heading": heading, "base": base, "scenarios": {}}
        console.print(f"[bold]{heading}[/]")
        counts = {key: max(1, trials[name] // FEWER.get(key, 1)) for key in chosen}
        collected = {key: ({}, {}) for key in chosen}
        # Trial by trial, each scenario in turn: the scenarios sharing a warm-up play it once a seed.
        numbers = range(first + shard[0], first + max(counts.values()), shard[1])
        progress = TrialProgress(name, len(numbers))
        for number in numbers:
            progress.step()
            for key in chosen:
                if number - first >= counts[key]:
                    continue
                seed = number * 7919 + (17 if key in SHARED_WARMUP else zlib.crc32(key.encode()) % 1000)
                found = trial(suite, SCENARIOS[key], seed, launch_sd)
                events, figures = collected[key]
                for event, happened in found.events.items():
                    events.setdefault(event, []).append(bool(happened))
                for figure, value in found.figures.items():
                    figures.setdefault(figure, []).append(value)
        for key in chosen:
            events, figures = collected[key]
            found_suite["scenarios"][key] = {"events": events, "figures": figures}
            console.print(f"  {key}: " + describe(events, figures, base, launch_sd), soft_wrap=True)
    if save is not None:
        save.write_text(json.dumps(raw))


class TrialProgress:
    """A line on stderr at every tenth of a shard's trials, with the time so far and an estimate of
    the rest: the rows print only at the end, and a nightly shard of 50 trials (healthy, 3-pt drop)
    ran 61 min on this project's 2-core machines."""

    def __init__(self, suite: str, total: int) -> None:
        self.suite, self.total, self.done = suite, total, 0
        self.started = time.monotonic()
        self.every = max(1, math.ceil(total / 10))

    def step(self) -> None:
        """Call before each trial: reports the trials finished so far."""
        if self.done and (self.done % self.every == 0):
            elapsed = time.monotonic() - self.started
            left = elapsed / self.done * (self.total - self.done)
            print(f"{self.suite}: {self.done}/{self.total} trials in {elapsed / 60:.1f} min, "
                  f"~{left / 60:.0f} min left", file=sys.stderr, flush=True)
        self.done += 1


def describe(events: dict[str, list[bool]], figures: dict[str, list[float]], base: float, launch_sd: float) -> str:
    parts = [f"{event} {interval(sum(happened), len(happened))}" for event, happened in events.items()]
    for figure, values in figures.items():
        values = np.array(values)
        if figure.startswith("GPU-s"):
            parts.append(f"{figure} mean {values.mean() / base:.3f} x one pass (max {values.max() / base:.2f})")
        else:
            within = np.mean(np.abs(values / launch_sd - 1) <= 0.25) if launch_sd else float("nan")
            bias = values.mean() / launch_sd - 1 if launch_sd else float("nan")
            parts.append(f"{figure} median {np.median(values) * 100:.2f} pts, 5-95% "
                         f"{np.quantile(values, 0.05) * 100:.2f}-{np.quantile(values, 0.95) * 100:.2f}, "
                         f"mean {bias:+.0%} off the truth, within 25% of it in {within:.0%}")
    return "; ".join(parts)


def merge(files: list[Path], console: Console) -> None:
    """The rows of several `--save` files of one configuration (shards), as one run would print them."""
    loaded = [json.loads(path.read_text()) for path in files]
    launch_sd = loaded[0]["launch_sd"]
    for name, first in loaded[0]["suites"].items():
        console.print(f"[bold]{first['heading']}[/] ({len(files)} shards)")
        for key in first["scenarios"]:
            events: dict[str, list[bool]] = {}
            figures: dict[str, list[float]] = {}
            for found in loaded:
                part = found["suites"][name]["scenarios"][key]
                for event, happened in part["events"].items():
                    events.setdefault(event, []).extend(happened)
                for figure, values in part["figures"].items():
                    figures.setdefault(figure, []).extend(values)
            console.print(f"  {key}: " + describe(events, figures, first["base"], launch_sd), soft_wrap=True)


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


FRONTIER = [(questions, launches) for questions in (2638, 5276) for launches in (1, 2, 3)]


def frontier(data, console: Console, draws: int, launch_sd: float = LAUNCH_SD) -> None:
    """The arithmetic of deciding a cell under launch spread: a healthy cell (its backend offset
    N(0, OFFSET_SD) from its reference) passes when its drop's upper bound is under min_effect, so a
    night is green when every cell's is. The drop's sd is measured on this answer model (`World`:
    launches of a cell and of its reference, `launches` each, on the first `questions` questions,
    `launch_sd` each), and the green rate is the product over the suite's non-reference cells of
    P(offset + error + z sd < min_effect), the error N(0, sd), z the shipped bound's one-sided
    quantile at one stage of four (98.75%). Normal arithmetic: the scenarios' rows are the measurement."""
    sds: dict[str, dict[tuple[int, int], float]] = {}  # model -> (questions, launches) -> sd: a model's, whatever the suite
    for name in ("pr", "nightly"):
        suite = Suite.load(name, data)
        gate = suite.inputs.loaded.suite.gate
        z = norm.ppf(pass_confidence_per_stage(gate.pass_confidence, 4))
        cells = [c for c in suite.inputs.matrix.cells if not c.is_reference]
        for model in suite.inputs.loaded.suite.models:
            if model.id not in sds:
                sds[model.id] = _drop_sds(suite, model.id, draws, launch_sd)
        console.print(f"frontier ({name}: {len(cells)} cells judged against a reference; green 80% needs each "
                      f"to pass with {0.8 ** (1 / len(cells)):.2%}; bound z {z:.2f}):")
        for key in FRONTIER:
            sd = np.array([sds[c.model.id][key] for c in cells])
            green = float(np.prod(norm.cdf((gate.min_effect - z * sd) / np.sqrt(sd ** 2 + OFFSET_SD ** 2))))
            console.print(f"  {key[0]} questions, {key[1]} launch(es) a side: drop sd "
                          + ", ".join(f"{m} {by[key] * 100:.2f}" for m, by in sds.items()
                                      if m in {c.model.id for c in cells}) + f" pts; green {green:.1%}")


DRIFT_LAUNCHES = (1, 2, 3, 4)  # launches of the drifting cell a night, for the bound's frontier


def drift_bound(data, console: Console, draws: int, launch_sd: float = LAUNCH_SD, drift: float = 0.005,
                nights: int = 6) -> None:
    """The most any test can catch the one-cell drift by night `nights` (the scenario "drift 0.5
    pt/night (one cell)": -drift x night from night 1, night 0 the pin), with every simplification in
    the test's favour: it knows which cell drifts and how (linear, from night 0), the reference's true
    accuracy, and that answers are Gaussian with a known sd; only the cell's launches are noisy (sd
    `s` a launch, measured on `World`: its launch shift and its launch's redraws). A healthy cell is
    one the gate's own tests allow: every night within `tolerance` of its reference and within
    `history_margin` of its pinned night. By Neyman-Pearson, no test with a false-red chance <= alpha
    at the healthy point nearest the drift can catch it with more than Phi(distance / s - z_alpha), the
    distance (over nights 0..`nights`, with the cell's own healthy offset c from its reference drawn
    as the benchmark draws it) minimised over that healthy set; averaged over c."""
    rng = np.random.default_rng(0)
    for name in ("pr", "nightly"):
        suite = Suite.load(name, data)
        gate = suite.inputs.loaded.suite.gate
        tolerance, margin = gate.tolerance, gate.own_margin
        target = dropped_cell(suite.inputs, suite.first_model())
        cell = next(c for c in suite.inputs.matrix.cells if c.cell_id == target)
        planned = suite.inputs.loaded.suite.num_questions
        reference = next(c for c in suite.inputs.matrix.cells if c.cell_id == cell.reference_cell)
        launch_var, apart = [], []
        for seed in range(draws):
            world = World.draw(seed, suite.questions, suite.inputs, Scenario("drift bound", offsets=False), launch_sd)
            mine, theirs = ([world.answers(side, night, 0, 0.0)[:planned].mean() for night in range(8)]
                            for side in (cell, reference))
            launch_var += [np.var(mine, ddof=1), np.var(theirs, ddof=1)]
            apart.append(np.mean(theirs) - np.mean(mine))
        # The cells' own difference on these questions (their fixed redraws), the launches' part taken out.
        question_var = float(np.mean(np.square(apart))) - 2 * float(np.mean(launch_var)) / 8
        s = math.sqrt(float(np.mean(launch_var)))
        c_sd = math.sqrt(max(question_var, 0.0) + OFFSET_SD ** 2)
        offsets = rng.normal(0, c_sd, 2000)
        night = np.arange(nights + 1)
        distances = np.array([_distance_to_healthy(c + drift * night, tolerance, margin) for c in offsets])
        per_cell = run_budget(suite.inputs).per_cell  # one cell's share of the run's alpha
        console.print(f"drift bound ({name}: {drift * 100:g} pt a night on one cell, red by night {nights}; a "
                      f"launch's sd on its {planned} questions {s * 100:.2f} pts, the cell's healthy offset sd "
                      f"{c_sd * 100:.2f}; tolerance {tolerance * 100:g}, history margin {margin * 100:g} pts):")
        for launches in DRIFT_LAUNCHES:
            sd = s / math.sqrt(launches)
            power = {alpha: float(np.mean(norm.cdf(distances / sd - norm.isf(alpha))))
                     for alpha in (gate.alpha, per_cell)}
            console.print(f"  {launches} launch(es) of the cell a night: caught at most {power[per_cell]:.1%} with "
                          f"one cell's share of alpha ({per_cell:.2g}), {power[gate.alpha]:.1%} with the run's "
                          f"whole alpha ({gate.alpha:g})")


def _distance_to_healthy(drops: np.ndarray, tolerance: float, margin: float) -> float:
    """The distance from a cell's drops from its reference night by night (night 0 its pin) to the
    nearest drops the gate calls healthy (each <= tolerance, and <= the pin's + margin): for a pin's
    drop m, each later night's nearest is min(drop, m + margin, tolerance); m searched on a grid
    from the pin's own drop (a lower m only moves every night further) up to tolerance."""
    pins = np.linspace(min(drops[0], tolerance), tolerance, 2001)
    later = np.minimum(drops[1:][None, :], np.minimum(pins + margin, tolerance)[:, None])
    best = float(((drops[0] - pins) ** 2 + ((drops[1:][None, :] - later) ** 2).sum(axis=1)).min())
    return math.sqrt(best)


def _drop_sds(suite: Suite, model: str, draws: int, launch_sd: float) -> dict[tuple[int, int], float]:
    """The sd of a healthy cell's measured drop from its reference (no offset), each side the mean of
    its launches on the same questions, for every (questions, launches) of FRONTIER: `World.answers`
    of one of `model`'s cells and its reference, a world per draw."""
    cell = next(c for c in suite.inputs.matrix.cells if c.model.id == model and not c.is_reference)
    reference = next(c for c in suite.inputs.matrix.cells if c.cell_id == cell.reference_cell)
    most = max(launches for _, launches in FRONTIER)
    drops: dict[tuple[int, int], list[float]] = {key: [] for key in FRONTIER}
    for seed in range(draws):
        world = World.draw(seed, suite.questions, suite.inputs, Scenario("frontier", offsets=False), launch_sd)
        mine = [world.answers(cell, 0, launch, 0.0) for launch in range(most)]
        theirs = [world.answers(reference, 0, launch, 0.0) for launch in range(most)]
        for questions, launches in FRONTIER:
            drops[(questions, launches)].append(
                float(np.mean([a[:questions].mean() for a in theirs[:launches]])
                      - np.mean([a[:questions].mean() for a in mine[:launches]])))
    return {key: float(np.std(values)) for key, values in drops.items()}


def early_stop(data, console: Console, draws: int) -> None:
    """The incident's cells (GSM8K 0.05-0.31, drawn uniformly) against the shipped Kimi-Linear floor,
    on the PR suite and the nightly, at the early-stop share CellJobs gives the floor's looks (half
    of the cell's, the other half going to the divergence looks), their wrong answers returned last."""
    for name in ("pr", "nightly"):
        suite = Suite.load(name, data)
        cell = next(c for c in suite.inputs.matrix.cells if not c.is_reference)
        gate = suite.inputs.loaded.suite.gate
        diverges = gate.divergence.enabled and cell.reference_cell is not None
        share = run_budget(suite.inputs).early_stop / max(1, (cell.model.floor > 0) + diverges)
        planned = list(suite.inputs.plan.test_indices())  # what the looks see
        rule = EarlyStop(cell.model.floor, len(planned), share, order=tuple(planned))
        first_look, first_limit = rule.thresholds[0]
        rng = random.Random(0)
        looks_taken, back = [], []
        for _ in range(draws):
            accuracy = rng.uniform(0.05, 0.31)
            right = {i: rng.random() < accuracy for i in planned}
            # Right answers first, junk last (it runs to the token limit), each in the order asked.
            arrival = sorted(planned, key=lambda i: not right[i])
            looks = Looks(rule)
            for count, i in enumerate(arrival, start=1):
                reason = looks.add(record(i, right[i]))
                if reason:
                    looks_taken.append(int(reason.split("first ")[1].split(" ")[0]))
                    back.append(count)
                    break
            else:
                looks_taken.append(len(planned))
                back.append(len(planned))
        at_first = sum(look == first_look for look in looks_taken)
        by_40 = sum(look <= 2 * first_look for look in looks_taken)
        console.print(f"early stop ({name}: floor {cell.model.floor:.3f}, {share:.2g} for the floor's looks over "
                      f"{len(rule.thresholds)} looks; at {first_look} questions at most {first_limit} right rejects): "
                      f"incident cells (0.05-0.31) stopped at the first look {interval(at_first, draws)}, by the "
                      f"second {interval(by_40, draws)}; answers back when stopped: median {int(np.median(back))}, "
                      f"95th percentile {int(np.quantile(back, 0.95))} of {len(planned)}; a cell at 0.31 exactly: at "
                      f"the first look {binom.cdf(first_limit, first_look, 0.31):.1%} (binomial), at 0.15: "
                      f"{binom.cdf(first_limit, first_look, 0.15):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pr-trials", type=int, default=300)
    parser.add_argument("--nightly-trials", type=int, default=100)
    parser.add_argument("--suites", default="pr,nightly")
    parser.add_argument("--launch-sd", type=float, default=LAUNCH_SD,
                        help="The fleet's true launch spread (sd, a fraction; default 0.005), in the scenarios, "
                             "the frontier and the drift's bound. The suites' own launch_sd stays their prior; the "
                             "gate measures the spread.")
    parser.add_argument("--gate", action="append", default=[], metavar="KEY=VALUE",
                        help="Override a gate setting of the shipped suites (max_launches=1), or a suite setting "
                             "(suite.num_questions=2638), repeatable")
    parser.add_argument("--only", default="size,early-stop,frontier,scenarios",
                        help="size, early-stop, frontier, scenarios (comma-separated)")
    parser.add_argument("--scenarios", default=None, help="Scenario names to play (comma-separated; default all)")
    parser.add_argument("--quick", action="store_true", help="1 trial of each scenario on the PR suite, one size case")
    parser.add_argument("--shard", default="0/1", help="i/n: only trials i, i+n, i+2n, ... (run n processes at once)")
    parser.add_argument("--first-trial", type=int, default=0,
                        help="number the trials from this one (their seeds follow it): more trials after a run")
    parser.add_argument("--save", type=Path, default=None, help="write the raw events and figures to this JSON file")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, help="print the rows of these --save files")
    args = parser.parse_args()
    console = Console(width=200)
    if args.merge:
        missing = [str(path) for path in args.merge if not path.is_file()]
        if missing:
            parser.error(f"--merge: no file {missing[0]} (a shard writes its --save file when it ends)")
        merge(args.merge, console)
        return
    parts = args.only.split(",")
    if "size" in parts:
        size(console, args.quick)
    if "early-stop" in parts:
        early_stop(load_gsm8k(), console, 50 if args.quick else 2000)
    if "frontier" in parts:
        data = load_gsm8k()
        frontier(data, console, 20 if args.quick else 400, args.launch_sd)
        drift_bound(data, console, 10 if args.quick else 400, args.launch_sd)
    if "scenarios" in parts:
        chosen = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
        unknown = [key for key in chosen if key not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
        suites = ["pr"] if args.quick else args.suites.split(",")
        trials = {"pr": 1, "nightly": 1} if args.quick else {"pr": args.pr_trials, "nightly": args.nightly_trials}
        overrides = {}
        for item in args.gate:
            key, _, value = item.partition("=")
            overrides[key] = yaml.safe_load(value)
        index, _, count = args.shard.partition("/")
        scenarios(load_gsm8k(), suites, trials, chosen, args.launch_sd, overrides, console, (int(index), int(count)),
                  args.save, args.first_trial)


if __name__ == "__main__":
    main()
