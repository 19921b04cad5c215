"""Launches as evidence: each side's launches in the paired tests, and launch spread measured from
launches made whatever their answers."""

from __future__ import annotations

import numpy as np
import pytest

from harness.gate.launches import (
    PRIOR_DF,
    Answers,
    SpreadEstimate,
    churn_floor,
    churn_variance,
    launch_sample,
    pooled_spread,
    spread_for_gate,
)
from harness.gate.stats import paired_comparison
from tests.records import answers


def launched(pattern: list[bool], launch: int, start: int = 0):
    return answers(pattern, start=start, launch=launch)


def test_effective_launches_count_what_the_mean_averages():
    same = Answers.of([*launched([True] * 10, 0), *launched([False] * 10, 1), *launched([True] * 10, 2)], "flexible")
    assert same.launches == pytest.approx(3.0) and same.right.tolist() == pytest.approx([2 / 3] * 10)
    halves = Answers.of([*launched([True] * 10, 0), *launched([True] * 10, 1, start=10)], "flexible")
    assert halves.launches == pytest.approx(2.0) and halves.is_binary  # each question answered once
    uneven = Answers.of([*launched([True] * 400, 0), *launched([True] * 2238, 1, start=400)], "flexible")
    assert uneven.launches == pytest.approx(1 / ((400 / 2638) ** 2 + (2238 / 2638) ** 2))  # 1.34
    assert not same.is_binary
    pooled = Answers.pooled([launched([True] * 10, 0), launched([True] * 10, 0)], "flexible")
    assert pooled.launches == pytest.approx(2.0)  # two runs' first launches are two launches


def test_more_launches_on_a_side_narrow_the_drops_bound():
    """With a launch spread of half a point, one launch against one carries 0.71 points of it into
    the drop; three against three, 0.41."""
    rng = np.random.default_rng(0)
    truth = rng.random(2638) < 0.9

    def side(launches: int) -> Answers:
        records = []
        for launch in range(launches):
            redraw = rng.random(2638) < 0.15
            right = np.where(redraw, rng.random(2638) < 0.9, truth)
            records += launched([bool(v) for v in right], launch)
        return Answers.of(records, "flexible")

    single = paired_comparison(side(1), side(1), 0.015, launch_sd=0.005)
    triple = paired_comparison(side(3), side(3), 0.015, launch_sd=0.005)
    assert single.launch_variance == pytest.approx(2 * 0.005**2)
    assert triple.launch_variance == pytest.approx(2 * 0.005**2 / 3)
    assert triple.drop_upper(0.975) - triple.drop < single.drop_upper(0.975) - single.drop


def test_a_deterministic_server_that_agrees_with_itself_is_not_a_sure_thing_on_few_questions():
    """Sides of several launches lose the exact tests; the questions' variance is then held at one
    question's worth at least, so 20 identical answers do not bound a drop under 3 points."""
    mine = Answers.of([*launched([True] * 20, 0), *launched([True] * 20, 1)], "flexible")
    theirs = Answers.of([*launched([True] * 20, 0), *launched([True] * 20, 1)], "flexible")
    paired = paired_comparison(mine, theirs, 0.015)
    assert paired.drop == 0 and paired.drop_upper(0.975) > 0.03


def planted(spread: float, cells: int, launches: int, seed: int = 0) -> list:
    """Launch samples of cells whose launches move by N(0, spread) on 2,638 questions (15% of
    answers redrawn per launch)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(cells):
        p = rng.beta(0.9, 0.1, 2638)
        typical = rng.random(2638) < p
        records = []
        for launch in range(launches):
            right = np.where(rng.random(2638) < 0.15, rng.random(2638) < p, typical)
            shift = rng.normal(0, spread)
            draws = rng.random(2638)
            right = right & ~(draws < -shift / 0.9) if shift < 0 else right | (draws < shift / 0.1)
            records += launched([bool(v) for v in right], launch)
        samples.append(launch_sample(records, "flexible"))
    return samples


def test_launch_spread_is_measured_from_launch_samples():
    estimate = pooled_spread(planted(0.005, cells=40, launches=2))
    assert estimate.df == 40 and abs(estimate.sd - 0.005) < 0.0015
    assert estimate.low < 0.005 < estimate.high
    quiet = pooled_spread(planted(0.0, cells=40, launches=2))
    assert quiet.sd < 0.0015  # the questions' own redraws are not taken for spread
    assert launch_sample(launched([True] * 5, 0), "flexible") is None  # one launch: no sample


def test_the_gate_weighs_the_suites_prior_in_as_prior_df_degrees_of_freedom_and_only_ever_up():
    def measured(sd: float, df: int) -> SpreadEstimate:
        return SpreadEstimate(sd=sd, low=0.0, high=2 * sd, df=df)

    assert spread_for_gate(0.004, None) == 0.004
    assert spread_for_gate(0.005, measured(0.0, PRIOR_DF)) == pytest.approx(0.005 / 2**0.5)  # half the weight
    assert spread_for_gate(0.005, measured(0.0, 3 * PRIOR_DF)) == pytest.approx(0.0025)  # the prior a quarter of the weight
    assert spread_for_gate(0.005, measured(0.009, 2)) == 0.009  # measured above the prior: as measured
    assert spread_for_gate(0.005, measured(0.004, 1000)) == pytest.approx(0.004, rel=0.01)  # the measurement carries it


def test_a_few_degrees_of_freedom_reading_low_no_longer_takes_the_launch_term_away():
    """9 degrees of freedom (DeepSeek-V2-Lite's 3 PR cells after three or four nights): the moment estimate of a
    true half point reads under 0.35 point on some seeds (11 of seeds 0-59 when this was written); with the
    prior weighed in, the gate's spread does not, and it stays within 20% of the truth on average."""
    raw, gate = [], []
    for seed in range(24):
        estimate = pooled_spread(planted(0.005, cells=9, launches=2, seed=seed))
        raw.append(estimate.sd)
        gate.append(spread_for_gate(0.005, estimate))
    assert sum(sd < 0.0035 for sd in raw) >= 1  # the premise: the measurement alone reads low
    assert min(gate) >= 0.0035 and abs(np.mean(gate) - 0.005) < 0.001


def test_answer_churn_is_bounded_below_from_a_pairs_disagreements_and_counts_each_sides_launches():
    """Two launches of a configuration that disagree on 100 of 2,000 questions: churn 100 / (2 x
    2,000) = 0.025 as measured, its 95% lower bound 0.0210 (Poisson: 84.14 disagreements). A side's
    churn adds churn / (its launches on a question) a question over n^2."""
    first = [True] * 2000
    second = [False] * 100 + [True] * 1900
    sample = launch_sample(launched(first, 0) + launched(second, 1), "flexible")
    assert sample.within * sample.n**2 / sample.df == pytest.approx(50)  # per question, a pair's disagreement / 2
    assert churn_floor([sample]) == pytest.approx(84.14 / 2 / 2000, rel=1e-3)
    assert churn_floor([sample, sample]) > churn_floor([sample])  # more pairs: a tighter bound, nearer 0.025
    assert churn_floor([]) == 0.0
    one = Answers.of(launched([True] * 10, 0), "flexible")
    two = Answers.of(launched([True] * 10, 0) + launched([True] * 5, 1), "flexible")  # 5 questions twice
    assert churn_variance(one, two, 0.02, other_fresh=False) == pytest.approx(0.02 * 10 / 100)
    assert churn_variance(one, two, 0.02, other_fresh=True) == pytest.approx(0.02 * (10 + 5 + 5 / 2) / 100)
    assert churn_variance(one, two, 0.0, other_fresh=True) == 0.0
