"""Deciding undecided cells: the relaunch stages and their budget, the references' second launches
(the run's launch-spread samples), and the model-wide tests, through the product's own Gating and
`decide` with answers made here instead of Ray and servers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import yaml

from harness.benchmark.gsm8k.protocol import build_plan
from harness.benchmark.scoring import score
from harness.gate.launches import pooled_spread
from harness.gate.model_wide import model_wide_test
from harness.gate.stats import paired_comparison
from harness.records import CellOutcome, Status, Timings
from harness.results.sinks import Sinks
from harness.run.build import RunInputs
from harness.run.gating import Gating
from harness.run.history import History
from harness.run.pipeline import decide, extends, run_budget
from harness.suite.config import load_suite
from harness.suite.matrix import Matrix, expand
from tests.records import answers, result, run_info


class EmptyArchive:
    def runs(self, suite):
        return []

    def cells(self, run_id):
        return []

    def questions(self, run_id, cell_id):
        return []


def suite_inputs(tmp_path, gsm8k, gate: dict, backends=("triton", "fa3", "flashinfer", "flashmla"),
                 models=("m",)) -> RunInputs:
    spec = {"suite": "ladder", "engine": "sim", "num_questions": 400, "seed": 0,
            "gate": {"alpha": 0.01, "tolerance": 0.015, "min_effect": 0.03, **gate},
            "models": [{"id": name, "path": "deepseek-ai/DeepSeek-V2-Lite-Chat", "accuracy": 0.9, "launch_sd": 0.01}
                       for name in models],
            "axes": {"attention_backend": list(backends)}}
    (tmp_path / "ladder.yaml").write_text(yaml.safe_dump(spec))
    loaded = load_suite(tmp_path / "ladder.yaml")
    plan = build_plan(gsm8k, "clean", 400, 0, 512)
    return RunInputs(loaded, Matrix(expand(loaded.suite).cells), gsm8k, plan)


class Launches:
    """A schedule that answers each launch of a cell from `right(cell_id, launch)` (True/False per
    question), records every launch it made, and says each held its GPU 100 s."""

    def __init__(self, right: Callable[[str, int], np.ndarray]) -> None:
        self.right = right
        self.made: list[tuple[str, int]] = []

    def __call__(self, cells, plan, on_outcome, label="", looks=True) -> None:
        for cell in cells:
            launch = sum(1 for made, _ in self.made if made == cell.cell_id)
            self.made.append((cell.cell_id, launch))
            right = self.right(cell.cell_id, launch)
            records = answers([bool(right[i]) for i in range(len(plan.prompts))])
            records = [r.model_copy(update={"index": p.index}) for r, p in zip(records, plan.prompts, strict=True)]
            on_outcome(cell, CellOutcome(cell_id=cell.cell_id, args=[], score=score(records, 1.0), questions=records,
                                         timings=Timings(startup_s=60.0, eval_s=40.0, started_at=0.0, ended_at=100.0)),
                       "", None)


class LeaningArchive(EmptyArchive):
    """One earlier night in which `cell_id` was left undecided with its evidence of a drop above 1."""

    def __init__(self, cell_id: str) -> None:
        self.cell_id = cell_id

    def runs(self, suite):
        return [run_info("before", suite="ladder", protocol_fingerprint="fp", ended_at="2026-12-01T01:00:00+00:00")]

    def cells(self, run_id):
        return [result(self.cell_id, Status.INCONCLUSIVE, evidence={"reference": (1, 1.5)})]


def night(inputs: RunInputs, schedule: Launches, archive=None) -> Gating:
    gate = inputs.loaded.suite.gate
    gating = Gating(gate, run_budget(inputs), "fp", History.of(archive or EmptyArchive(), "ladder", "fp", "now", None),
                    Sinks([]), extends=extends(inputs))
    schedule(list(inputs.matrix.cells), inputs.plan, lambda cell, outcome, log, console: gating.offer(cell, outcome, log))
    decide(inputs, gating, schedule)
    gating.release_waiting()
    return gating


def fixed(seed: int, accuracy: float = 0.9) -> Callable[[str, int], np.ndarray]:
    """Every launch of every cell draws its own answers at `accuracy` (launches differ question by question)."""
    def right(cell_id: str, launch: int) -> np.ndarray:
        rng = np.random.default_rng([seed, sum(map(ord, cell_id)), launch])
        return rng.random(400) < accuracy
    return right


def test_undecided_cells_are_launched_again_with_their_reference_and_judged_on_every_launch(tmp_path, gsm8k):
    """400 questions and a prior spread of a point: no cell can bound its drop under 3 points on
    one launch; each relaunch narrows it, the reference is launched beside them, and every launch
    is in the cell's answers."""
    inputs = suite_inputs(tmp_path, gsm8k, {"max_launches": 3, "measure_launch_spread": True})
    schedule = Launches(fixed(0))
    gating = night(inputs, schedule)
    results = gating.results()
    reference = next(c.cell_id for c in inputs.matrix.cells if c.is_reference)
    launches = {cell_id: sum(1 for made, _ in schedule.made if made == cell_id) for cell_id in results}
    assert launches[reference] == 3  # its second launch (a measurement) and its third (beside its undecided cells)
    relaunched = [cell_id for cell_id in results if cell_id != reference and launches[cell_id] > 1]
    assert relaunched  # 400 questions do not decide a cell
    for cell_id in relaunched:
        result = results[cell_id]
        assert result.launches == launches[cell_id] and result.stage == launches[cell_id]
        assert f"launched {launches[cell_id]} times" in result.reason
        assert {r.launch for r in gating.answers(cell_id).questions} == set(range(launches[cell_id]))
    # Only the reference's second launch was made whatever the answers: the run's one launch-spread sample.
    assert results[reference].launch_sample is not None and results[reference].launch_sample.df == 1
    assert all(results[c].launch_sample is None for c in relaunched)


def test_the_budget_for_undecided_cells_stops_the_relaunches_and_the_cells_say_so(tmp_path, gsm8k):
    """4 cells of 100 GPU-seconds each: 30% of that is one relaunch (the reference's second launch
    takes it); the undecided cells stay inconclusive and say why."""
    inputs = suite_inputs(tmp_path, gsm8k, {"max_launches": 3, "measure_launch_spread": True, "undecided_budget": 0.3})
    schedule = Launches(fixed(1))
    gating = night(inputs, schedule)
    assert len(schedule.made) == 4 + 1
    undecided = [r for r in gating.results().values() if r.status is Status.INCONCLUSIVE]
    assert undecided and all("budget for undecided cells (30% of the first pass's GPU-seconds) was spent" in r.reason
                             for r in undecided)
    assert all(r.decide and r.decide.startswith(("another launch", "more questions")) for r in undecided)


def test_a_cell_whose_evidence_leans_to_a_drop_is_launched_again_first_and_beyond_the_budget(tmp_path, gsm8k):
    """The same 30% budget, but one cell was left undecided last night with its evidence of a drop
    above 1: it is launched again from the reserve (as large as the budget), before the healthy
    undecided cells, which the spent budget leaves as they were."""
    inputs = suite_inputs(tmp_path, gsm8k, {"max_launches": 3, "measure_launch_spread": True, "undecided_budget": 0.3})
    leaning = next(c.cell_id for c in inputs.matrix.cells if not c.is_reference)
    schedule = Launches(fixed(1))
    gating = night(inputs, schedule, LeaningArchive(leaning))
    launches = {cell_id: sum(1 for made, _ in schedule.made if made == cell_id) for cell_id in gating.results()}
    others = [cell_id for cell_id in launches if cell_id != leaning and not inputs.matrix.by_id()[cell_id].is_reference]
    assert gating.leaning(leaning) and not any(gating.leaning(c) for c in others)
    # The budget (120 GPU-s) went to the reference's second launch; the leaning cell's relaunch (100)
    # came from the reserve (120 more), which a third launch of it and its reference would exceed.
    assert launches[leaning] == 2 and all(launches[c] == 1 for c in others)
    assert all("was spent" in gating.results()[c].reason for c in others if gating.undecided(c))


def test_a_model_wide_drop_fails_the_cells_that_moved_together_and_a_small_shift_does_not():
    rng = np.random.default_rng(3)

    def drops(shift: float) -> list:
        found = []
        for _ in range(30):
            before = rng.random(2638) < 0.9
            after = np.where(rng.random(2638) < 0.03, rng.random(2638) < 0.9, before)
            after = after & ~(rng.random(2638) < shift / 0.9)
            found.append(paired_comparison({i: bool(v) for i, v in enumerate(after)},
                                           {i: bool(v) for i, v in enumerate(before)}, 0.01, launch_sd=0.005))
        return found

    moved = model_wide_test("m", "its last runs", drops(0.025), 0.01, 1e-4)
    assert moved.rejected and "the 30 cells of m" in moved.describe() and moved.drop > 0.015
    steady = model_wide_test("m", "its last runs", drops(0.0), 0.01, 1e-4)
    assert not steady.rejected
    assert model_wide_test("m", "its last runs", drops(0.05)[:2], 0.01, 1e-4) is None  # under 3 cells: no test


def test_pool_launch_spread_gives_every_model_one_estimate_from_all_their_samples(tmp_path, gsm8k):
    """Two models, each reference launched a second time: one sample (1 df) a model. Pooled
    (gate.pool_launch_spread), each model's spread is the estimate over both samples."""
    spreads = {}
    for pooled in (False, True):
        folder = tmp_path / str(pooled)
        folder.mkdir()
        inputs = suite_inputs(folder, gsm8k, {"max_launches": 2, "measure_launch_spread": True, "pool_launch_spread": pooled},
                              backends=("triton", "fa3"), models=("m", "n"))
        gating = night(inputs, Launches(fixed(2)))
        samples = {r.model: r.launch_sample for r in gating.results().values() if r.launch_sample is not None}
        assert set(samples) == {"m", "n"} and all(s.df == 1 for s in samples.values())
        spreads[pooled] = {model: gating.spread(model) for model in ("m", "n")}
        if pooled:
            both = pooled_spread(list(samples.values()))
            assert spreads[True]["m"] == spreads[True]["n"] == both and both.df == 2
        else:
            assert all(spreads[False][model] == pooled_spread([samples[model]]) for model in ("m", "n"))
    assert spreads[False]["m"] != spreads[False]["n"]  # the models' own samples differ
