"""Accuracies, floors, launch spreads and the pinned run proposed from measured runs (`regress calibrate`)."""

from __future__ import annotations

import numpy as np

from harness.analysis.calibrate import (
    LaunchPair,
    pinnable_run,
    propose_divergence,
    propose_floors,
    propose_launch_spread,
    propose_self_check_tolerance,
)
from harness.records import CellResult, RunInfo, Status, latest_per_cell
from tests.records import result, run_info


def info(run_id: str, interrupted: bool = False) -> RunInfo:
    return run_info(run_id, interrupted=interrupted)


def cell(cell_id: str, model: str, status: Status, correct: int, n: int, floor_n: int = 0,
         floor_correct: int = 0) -> CellResult:
    return result(cell_id, status, model, reason="", correct=correct, n=n, accuracy=correct / n, floor_n=floor_n,
                  floor_correct=floor_correct)


def test_the_floor_proposed_is_the_measured_accuracy_minus_the_margin():
    runs = [(info("a"), [cell("m.x", "m", Status.PASS, 1187, 1319), cell("m.y", "m", Status.INCONCLUSIVE, 1170, 1319)]),
            (info("b"), [cell("m.x", "m", Status.PASS, 1180, 1319), cell("m.y", "m", Status.FAIL, 300, 1319)])]
    (proposal,) = propose_floors(runs, {"m": 0.88}, floor_margin=0.03)
    assert proposal.cells == 3 and proposal.runs == 2  # the failing cell is not evidence of the model's accuracy
    assert abs(proposal.mean - (1187 + 1170 + 1180) / 3 / 1319) < 1e-12
    assert abs(proposal.lowest - 1170 / 1319) < 1e-12 and 0.868 < proposal.lowest_bound < 0.87
    assert proposal.proposed == 0.863 and proposal.change == "lower"  # 0.89386 - 0.03, rounded down


def test_floors_use_the_test_questions_the_floor_is_tested_on_not_the_extension():
    extended = cell("m.x", "m", Status.PASS, correct=2500, n=2638, floor_n=1319, floor_correct=1180)
    (proposal,) = propose_floors([(info("a"), [extended])], {"m": 0.80})
    assert abs(proposal.lowest - 1180 / 1319) < 1e-12 and proposal.change == "raise"


def test_a_model_without_passing_cells_gets_no_proposal():
    assert propose_floors([(info("a"), [cell("m.x", "m", Status.FAIL, 10, 200)])], {"m": 0.8, "other": 0.5}) == []


def test_the_run_to_pin_is_the_newest_in_which_every_cell_that_ran_passed():
    good = [cell("m.x", "m", Status.PASS, 180, 200), cell("m.z", "m", Status.SKIPPED, 0, 1)]
    runs = [(info("old"), good), (info("mixed"), [*good, cell("m.y", "m", Status.INCONCLUSIVE, 170, 200)]),
            (info("newest", interrupted=True), good)]
    assert pinnable_run(runs).run_id == "old"
    assert pinnable_run(runs[1:2]) is None


def test_a_later_line_of_a_cell_replaces_the_earlier_one():
    first, again = cell("m.x", "m", Status.INCONCLUSIVE, 170, 200), cell("m.x", "m", Status.PASS, 1180, 1319)
    assert list(latest_per_cell([first, again]).values()) == [again]


def test_the_divergence_tolerance_proposed_covers_the_worst_backend_pair_with_margin():
    def diverged(cell_id: str, backend: str, high: float | None, status: Status = Status.PASS) -> CellResult:
        return result(cell_id, status, "m", factors={"attention_backend": backend}, reference_cell="m.ref",
                      divergence_high=high)

    reference = result("m.ref", Status.PASS, "m", factors={"attention_backend": "triton"})
    runs = [(info("a"), [reference, diverged("m.fa3", "fa3", 0.012), diverged("m.fi", "flashinfer", 0.031)]),
            (info("b"), [reference, diverged("m.fa3", "fa3", 0.02), diverged("m.fi", "flashinfer", 0.9, Status.FAIL)])]
    (proposal,) = propose_divergence(runs, {"m": 0.1, "other": 0.1})
    assert proposal.pairs == {"fa3 vs triton": 0.02, "flashinfer vs triton": 0.031}  # the failing cell is no evidence
    assert proposal.cells == 3 and proposal.proposed == 0.047  # 1.5 x 0.031, rounded up to two digits
    assert propose_divergence([(info("a"), [reference])], {"m": 0.1}) == []  # never tested: nothing to propose


def test_the_launch_spread_measured_recovers_the_one_planted():
    """Cells whose accuracy moves by N(0, 0.5 pt) a launch, beyond 2.5% discordance on 2,638
    questions, over 9 pairs of runs of 36 cells: the estimate is within a tenth of a point; with no
    spread planted it is near 0; a build shift common to every cell is not spread."""
    rng = np.random.default_rng(0)

    def pairs(spread: float, shift: float) -> list[LaunchPair]:
        found = []
        for night in range(9):
            for _ in range(36):
                n, discordant = 2638, rng.binomial(2638, 0.025)
                drop = shift + rng.normal(0, spread) * np.sqrt(2)
                losses = int(np.clip(rng.binomial(discordant, np.clip(0.5 + drop * n / (2 * max(discordant, 1)), 0, 1)),
                                     0, discordant))
                found.append(LaunchPair("m", (f"r{night}", f"r{night + 1}"), losses, discordant - losses, n))
        return found

    (planted,) = propose_launch_spread(pairs(0.005, 0.0))
    assert planted.pairs == 324 and abs(planted.launch_sd - 0.005) < 0.001
    (quiet,) = propose_launch_spread(pairs(0.0, 0.0))
    assert quiet.launch_sd < 0.0015
    (shifted,) = propose_launch_spread(pairs(0.0, -0.01))
    assert shifted.launch_sd < 0.0015


def test_the_self_check_tolerance_proposed_covers_the_worst_passing_cell_with_margin():
    runs = [(info("a"), [result("m.x", Status.PASS, "m", self_check_high={"co-batch": 0.012, "cache": 0.02}),
                         result("m.y", Status.FAIL, "m", self_check_high={"co-batch": 0.9, "cache": 1.4})]),
            (info("b"), [result("m.x", Status.PASS, "m", self_check_high={"co-batch": 0.031, "cache": 0.0}),
                         result("m.z", Status.PASS, "m")])]  # z made no self-check
    proposal = propose_self_check_tolerance(runs, None)
    assert proposal.checks == {"cache": 0.02, "co-batch": 0.031}  # the failing cell is no evidence
    assert proposal.cells == 2 and proposal.proposed == 0.047 and proposal.current is None
    still = [(info("c"), [result("m.x", Status.PASS, "m", self_check_high={"co-batch": 0.0, "cache": 0.0})])]
    assert propose_self_check_tolerance(still, 0.1) is None  # nothing moved: no spread to scale
