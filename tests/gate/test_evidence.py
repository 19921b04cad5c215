"""Evidence across nights: an e-value per night whose product keeps the per-night error rate, and a
cell's streak of nights without a pass kept out of the baseline it is measured against."""

from __future__ import annotations

import math

import numpy as np

from harness.gate.budget import Budget
from harness.gate.evidence import NightDrop, joint_log_e, night_drop, rejects
from harness.gate.stats import Paired
from harness.gate.verdict import Stage, judge
from harness.records import Status
from harness.run.history import History
from harness.suite.config import GateSpec
from tests.records import answers, outcome
from tests.run.test_history import MemoryArchive, info


def night_log_e(paired: Paired, min_effect: float) -> float:
    return joint_log_e([night_drop(paired)], min_effect - paired.margin)


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
    carried = [NightDrop(0.02, 0.006**2, 0.0), NightDrop(0.025, 0.006**2, 0.0)]  # two nights 3 and 3.5 points down
    second = judge(tonight, 0.5, gate, stage, history=before, launch_sd=0.005, carried={"history": carried})
    kept = [NightDrop(*night) for night in second.evidence_nights["history"]]
    assert kept[:2] == carried and len(kept) == 3 and kept[2].excess == first.evidence_nights["history"][0][0]
    assert second.evidence["history"] == (3, joint_log_e(kept, gate.min_effect - gate.own_margin))
    assert second.evidence["history"][1] > log_e
    assert second.status is Status.FAIL and "evidence vs its last runs over 3 night(s)" in second.reason


def test_nights_that_share_their_questions_are_weighed_together_not_multiplied():
    """Every night asks the same questions, so the part of a cell's drop its configuration brings to
    them comes back every night. Five nights at the margin whose drops share 0.45 of their 0.65
    point of sd: the product of the nights' e-values reaches 1/alpha twice as often as alpha allows;
    their joint likelihood ratio keeps to it, and still catches a 3-point drop on some nights."""
    rng = np.random.default_rng(1)
    variance, shared, delta, alpha = 0.0065**2, 0.0045**2, 0.015, 1e-2
    persistent = rng.normal(0, math.sqrt(shared), (20_000, 1))
    excess = persistent + rng.normal(0, math.sqrt(variance - shared), (20_000, 5))
    product = ((delta * excess - delta * delta / 2) / variance).sum(axis=1)
    joint = np.array([joint_log_e([NightDrop(x, variance, shared) for x in row], delta) for row in excess])
    assert np.mean([rejects(log_e, alpha) for log_e in product]) > 1.5 * alpha
    assert np.mean([rejects(log_e, alpha) for log_e in joint]) <= alpha
    dropped = [joint_log_e([NightDrop(x, variance, shared) for x in row], delta) for row in excess[:2000] + 0.015]
    assert np.mean([rejects(log_e, alpha) for log_e in dropped]) > 0.4
    # nights that share nothing: the product of their e-values, as before
    alone = [NightDrop(0.01, 0.006**2, 0.0), NightDrop(0.02, 0.005**2, 0.0)]
    assert math.isclose(joint_log_e(alone, delta), sum(joint_log_e([night], delta) for night in alone))


def test_the_streak_without_a_pass_is_left_out_of_the_baseline_and_a_pass_starts_the_evidence_again():
    archive = MemoryArchive([(info("night-1"), {"a": Status.PASS}), (info("night-2"), {"a": Status.PASS}),
                             (info("night-3"), {"a": Status.INCONCLUSIVE}), (info("night-4"), {"a": Status.INCONCLUSIVE})])
    history = History.of(archive, "nightly", "fp", "night-5", pool=5)
    assert history.baseline("a", before_streak=True).run_ids == ("night-2", "night-1")
    assert history.baseline("a").run_ids == ("night-4", "night-3", "night-2", "night-1")  # the paired test's
    passed = MemoryArchive([(info("night-1"), {"a": Status.INCONCLUSIVE}), (info("night-2"), {"a": Status.PASS})])
    assert History.of(passed, "nightly", "fp", "night-3").carried_evidence("a") == {}
    assert History.of(passed, "nightly", "fp", "night-3").carried_nights("a") == {}


def test_the_nights_behind_a_cells_evidence_are_carried_to_the_next_night_and_an_older_record_starts_again():
    kept = {"reference": [(0.01, 4e-5, 2e-5), (0.02, 3e-5, 2e-5)]}
    archive = MemoryArchive([(info("night-1"), {"a": Status.INCONCLUSIVE, "b": Status.INCONCLUSIVE})],
                            evidence={("night-1", "a"): {"reference": (2, 1.2)}, ("night-1", "b"): {"reference": (2, 1.2)}},
                            nights={("night-1", "a"): kept})
    history = History.of(archive, "nightly", "fp", "night-2")
    assert history.carried_nights("a") == {"reference": [NightDrop(*night) for night in kept["reference"]]}
    assert history.carried_nights("b") == {}  # written before the nights were kept: its evidence starts again


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
    carried = {"reference": [NightDrop(0.01, 0.006**2, 0.0)]}
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
