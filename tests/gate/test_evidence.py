"""Evidence across nights: an e-value per night whose product keeps the per-night error rate, and a
cell's streak of nights without a pass kept out of the baseline it is measured against."""

from __future__ import annotations

import math

import numpy as np

from harness.gate.budget import Budget
from harness.gate.evidence import NightDrop, joint_log_e, night_drop, rejects
from harness.gate.launches import Answers, churn_floor, churn_variance, launch_sample
from harness.gate.stats import Paired, paired_comparison
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


def test_what_tonights_launches_churn_is_not_counted_as_shared_and_the_nights_add_up_more():
    """Questions answered as benchmarks/gate_calibration.py's answer model does (a 0.72 model; each
    configuration redraws 16.8% of its answers for good, each launch 15% afresh), a cell's one launch
    against its reference's two a night, 2,638 questions, 600 cells of 3 nights each. The drops'
    covariance from night to night is about half their variance; taking tonight's churn (bounded
    below from one pair of reference launches) out of what the nights may share leaves a bound above
    that covariance, and well under the questions' whole variance that was counted before. A cell
    exactly at the margin stays under alpha; a 3-point drop is caught more often over 3 nights."""
    rng = np.random.default_rng(2)
    n, margin, delta, alpha = 2638, 0.015, 0.015, 0.05
    p = rng.beta(0.72, 0.28, n)
    typical = rng.random(n) < p

    def configuration():
        return np.where(rng.random(n) < 0.168, rng.random(n) < p, typical)

    def launch(answered):
        return np.where(rng.random(n) < 0.15, rng.random(n) < p, answered)

    reference = configuration()
    pair = [launch(reference), launch(reference)]
    churn = churn_floor([launch_sample(answers(list(pair[0]), launch=0) + answers(list(pair[1]), launch=1), "flexible")])
    expected = 0.85 * reference + 0.15 * p  # each question's chance a launch answers it right
    assert 0.7 * np.mean(expected * (1 - expected)) < churn < np.mean(expected * (1 - expected))
    questions, once, twice = np.arange(n), np.zeros(n, dtype=np.int64), np.repeat([0, 1], n)

    def nights(drop: float) -> list[tuple[float, NightDrop, NightDrop]]:
        cell, reference, broken = configuration(), configuration(), rng.random(n)
        found = []
        for _ in range(3):
            mine = Answers.from_arrays(questions, (launch(cell) & ~(broken < drop / p.mean())).astype(float), once)
            theirs = Answers.from_arrays(np.tile(questions, 2), np.r_[launch(reference), launch(reference)].astype(float),
                                         twice)
            night = paired_comparison(mine, theirs, margin)
            fresh = churn_variance(mine, theirs, churn, other_fresh=True)
            found.append((night.drop, night_drop(night), night_drop(night, fresh=fresh)))
        return found

    at_margin, dropped = [nights(margin) for _ in range(600)], [nights(0.03) for _ in range(600)]
    drops = np.array([[drop for drop, _, _ in cell] for cell in at_margin])
    covariance, variance = np.cov(drops[:, 0], drops[:, 1])[0, 1], drops[:, 0].var()
    before = np.mean([cell[0][1].shared for cell in at_margin])
    now = np.mean([cell[0][2].shared for cell in at_margin])
    assert 0.4 * variance < covariance < now < 0.8 * before

    def rate(cells, which: int) -> float:
        return float(np.mean([rejects(joint_log_e([night[which] for night in cell], delta), alpha) for cell in cells]))

    assert rate(at_margin, 2) <= alpha
    assert rate(dropped, 2) > rate(dropped, 1) + 0.05


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
