"""Evidence across nights: an e-value per night whose product keeps the per-night error rate, and a
cell's streak of nights without a pass kept out of the baseline it is measured against."""

from __future__ import annotations

import math

import numpy as np

from harness.gate.budget import Budget
from harness.gate.evidence import night_log_e, rejects
from harness.gate.stats import Paired
from harness.gate.verdict import Stage, judge
from harness.records import Status
from harness.run.history import History
from harness.suite.config import GateSpec
from tests.records import answers, outcome
from tests.run.test_history import MemoryArchive, info


def paired(drop: float, sd: float, margin: float) -> Paired:
    n = 2638
    return Paired(n=n, agreement=0.95, losses=0.0, gains=0.0, accuracy=0.9, reference_accuracy=0.9, drop=drop,
                  drop_ci=(drop, drop), margin=margin, p_drop=0.5, sampling_variance=sd * sd)


def test_a_nights_e_value_averages_at_most_one_under_the_null_and_grows_under_a_drop():
    rng = np.random.default_rng(0)
    sd, margin = 0.006, 0.01
    at_margin = [math.exp(night_log_e(paired(d, sd, margin), 0.03)) for d in rng.normal(margin, sd, 200_000)]
    below = [math.exp(night_log_e(paired(d, sd, margin), 0.03)) for d in rng.normal(0.0, sd, 200_000)]
    assert abs(np.mean(at_margin) - 1) < 0.05 and np.mean(below) < 0.01
    # Markov: the chance a healthy night's product reaches 1/alpha is at most alpha (here far less)
    alpha = 1e-3
    three = rng.normal(margin, sd, (100_000, 3))
    totals = [sum(night_log_e(paired(d, sd, margin), 0.03) for d in row) for row in three]
    assert np.mean([rejects(t, alpha) for t in totals]) <= alpha
    dropped = rng.normal(0.03, sd, (2000, 3))
    caught = [rejects(sum(night_log_e(paired(d, sd, margin), 0.03) for d in row), alpha) for row in dropped]
    assert np.mean(caught) > 0.9  # three nights of a 3-point drop: the product passes 1/alpha


def test_judge_carries_a_cells_evidence_and_tests_it_from_its_second_night():
    gate = GateSpec(tolerance=0.015, history_margin=0.01, min_effect=0.03)
    stage = Stage(alpha=Budget(0.01, 10).stage(1))
    before = outcome(answers([True] * 1800 + [False] * 200))  # 0.90
    tonight = outcome(answers([True] * 1740 + [False] * 260))  # 0.87: 3 points down
    first = judge(tonight, 0.5, gate, stage, history=before, launch_sd=0.005)
    nights, log_e = first.evidence["history"]
    assert nights == 1 and log_e > 0 and "evidence vs" not in first.reason  # no accumulated test on a first night
    second = judge(tonight, 0.5, gate, stage, history=before, launch_sd=0.005, carried={"history": (2, 40.0)})
    assert second.evidence["history"] == (3, 40.0 + log_e)
    assert second.status is Status.FAIL and "evidence vs its last runs over 3 night(s)" in second.reason


def test_the_streak_without_a_pass_is_left_out_of_the_baseline_and_a_pass_starts_the_evidence_again():
    archive = MemoryArchive([(info("night-1"), {"a": Status.PASS}), (info("night-2"), {"a": Status.PASS}),
                             (info("night-3"), {"a": Status.INCONCLUSIVE}), (info("night-4"), {"a": Status.INCONCLUSIVE})])
    history = History.of(archive, "nightly", "fp", "night-5", pool=5)
    assert history.baseline("a", before_streak=True).run_ids == ("night-2", "night-1")
    assert history.baseline("a").run_ids == ("night-4", "night-3", "night-2", "night-1")  # the paired test's
    passed = MemoryArchive([(info("night-1"), {"a": Status.INCONCLUSIVE}), (info("night-2"), {"a": Status.PASS})])
    assert History.of(passed, "nightly", "fp", "night-3").carried_evidence("a") == {}


def test_a_relaunch_stage_tests_and_keeps_the_evidence_over_every_launch():
    """Tonight's factor at a relaunch stage reads all the cell's launches and its reference's (a
    smaller variance: the launch spread halves), and the nights after carry that factor (the
    likelihood ratio where the night stopped launching: harness.gate.evidence)."""
    gate = GateSpec(tolerance=0.015, history_margin=0.01, min_effect=0.03)
    stage = Stage(alpha=Budget(0.01, 10).stage(1), number=3)
    reference = outcome(answers([True] * 1800 + [False] * 200, launch=0) + answers([True] * 1800 + [False] * 200, launch=1))
    first_night = [True] * 1740 + [False] * 260  # 3 points down
    one = outcome(answers(first_night, launch=0))
    two = outcome(answers(first_night, launch=0) + answers(first_night, launch=1))
    carried = {"reference": (1, 2.0)}
    alone = judge(one, 0.5, gate, stage, reference=reference, launch_sd=0.005, carried=carried)
    both = judge(two, 0.5, gate, stage, reference=reference, launch_sd=0.005, carried=carried)
    shown = {v.reason.split("evidence vs reference over 2 night(s) (")[1].split(")")[0] for v in (alone, both)}
    assert shown == {"first launches", "tonight's 2 launches"}

    def tested(verdict) -> float:
        text = verdict.reason.split("evidence vs reference over 2 night(s) (")[1].split(": e=")[1].split(" ")[0]
        return math.log(float(text.rstrip(";")))

    for verdict in (alone, both):  # what is kept is what was tested
        assert verdict.evidence["reference"][0] == 2
        assert math.isclose(verdict.evidence["reference"][1], tested(verdict), rel_tol=0.01)
    assert tested(both) > tested(alone) + 0.5  # the same drop, measured with half the launch spread
