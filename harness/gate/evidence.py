"""Evidence that accumulates across nights (pure): an e-process per cell and test.

One night's launch cannot tell a 3-point drop from launch spread at the alpha a run gives one test;
several nights of it can (as far as their noise is their own, not their questions': below), if
their evidence is combined without spending alpha again each night. A
likelihood ratio is an e-value (its expectation is at most 1 when the null holds), and a product of
e-values, each taken given the nights before, is too (a test supermartingale): by Markov's
inequality, "the product reaches 1/alpha" happens with chance at most alpha on any one night,
however many nights the product has run and whenever it was started or stopped. So each test that
accumulates spends only its share of each night's alpha, like any other test.

Tonight's e-value of a paired drop D (variance V) against "drop <= margin", at the alternative
"drop = min_effect" (delta = min_effect - margin):

    log e = (delta (D - margin) - delta^2 / 2) / V

its expectation under any drop <= margin is at most 1. D and V are over every launch the cell (and
its reference) has when it is judged: the night launches a cell again because its first launch
looked undecided, and stops when it is decided or the budget is spent. That is no obstacle: for
Gaussian launches the formula is the likelihood ratio of the joint answers of the launches so far
(their mean D is the statistic; V = sampling variance + launch_sd^2 (1/k + 1/m) for k launches
against m), and a likelihood ratio, launch after launch, is a martingale under the null's boundary
(a supermartingale below it), so where the night stopped it is still an e-value (optional
stopping; the launches stop by the third). The paired drop of the gate is close to, not exactly,
that statistic (a question counts by the share of its launches that got it right, the extension's
launch asks other questions), and V uses the launch spread the gate holds (measured, with the
suite's prior weighed in: harness.gate.launches.spread_for_gate) as known: the least-favourable rows
of benchmarks/gate_calibration.py measure what the approximation costs (session 33, the measurement
alone: 3 of 300 PR nights red with history, each on a DeepSeek-V2-Lite spread read at 0.0-0.4 point
for a true 0.5; session 34, with the prior: 0 of 300). A cell's evidence runs over its consecutive
nights since it last passed (a pass starts it again) and is kept in cells.jsonl (`evidence`, and
the nights behind it in `evidence_nights`), each night's drop at the cell's last stage that night
(the one tested then).

The nights are not independent: every night asks the same questions. A cell's configuration
answers some of them otherwise than its reference's on every launch (its numerics), and the drop
the gate tests is the one over the questions such a suite could have asked (the paired tests' own
variance counts the questions' part), so that part of a night's drop comes back every night, and a
product of the nights' e-values counts it once a night: PR nights whose cells sat exactly
`tolerance` under their reference went red on it on 4 of 300 (benchmarks/gate_calibration.py,
session 33). So the evidence since the last pass is the likelihood ratio of all those nights'
drops together (`joint_log_e`), Gaussian with each night's variance on
the diagonal and, between two nights, the most they can share: the smaller of their questions'
parts of the variance less what tonight's launches churn (a launch answers some questions otherwise
than its configuration does on average, afresh each launch: the model's answer churn, bounded below
from its references' second launches, harness.gate.launches.churn_floor; the cell's launches and,
for the reference test, the reference's, launched again every night; not the history's baseline,
the same runs on every night since the cell's pass), plus, for the history test, whose nights pair
with the same baseline runs, the smaller of the baseline's launch parts. Where no launch has
measured the churn, none is taken out: the questions' whole part may be shared. A night whose
questions' part is all shared adds only its launches' evidence; one night alone is the e-value
above. In the answer model of benchmarks/gate_calibration.py (a 0.72 model, one launch of the cell
against two of its reference) the nights' drops share 0.57 of a night's variance; the bound with
churn taken out is 0.62 of it, without 0.95 (tests/gate/test_evidence.py, 600 simulated cells).

The restart is chosen by the nights themselves, so the likelihood ratio since the last pass is one
of the ratios over tonight's trailing nights; where the ratio is a martingale under the null (the
covariance above bounds the true one), the largest of those reaches 1/alpha with chance about alpha
at most (Ville's inequality, read backwards in time, holds exactly for independent nights; the
least-favourable rows of benchmarks/gate_calibration.py measure what the rest costs). Each stage at
which the ratio is tested spends its own share of the night's alpha, like any other test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from harness.gate.stats import Paired

LABELS = {"reference": "reference", "history": "its last runs"}  # the tests that accumulate


class NightDrop(NamedTuple):
    """One night's paired drop as an accumulating test keeps it (cells.jsonl `evidence_nights`)."""

    excess: float  # the drop minus the test's margin
    variance: float  # the drop's whole variance: its questions' and its launches'
    shared: float  # the most of it another night may share (module docstring)


def night_drop(paired: Paired, shared_launches: bool = False, fresh: float = 0.0) -> NightDrop:
    """Tonight's drop; `shared_launches`: the other side's runs may be the same on another night (the
    history test's baseline), so their launch part may be shared too; `fresh`: the part of its
    questions' variance that tonight's launches' own answer churn makes (at the churn's lower bound:
    harness.gate.launches.churn_variance), which no other night shares."""
    shared = max(paired.variance - paired.launch_variance - fresh, 0.0)
    if shared_launches:
        shared += paired.launch_sd**2 / max(paired.launches[1], 1)
    return NightDrop(paired.drop - paired.margin, paired.variance, min(shared, paired.variance))


def joint_log_e(nights: Sequence[NightDrop], delta: float) -> float:
    """The log likelihood ratio of the nights' drops at "drop = margin + delta" against "drop =
    margin", Gaussian with each night's variance on the diagonal and min(shared) between two nights
    (module docstring). The nights are weighed by the inverse covariance's row sums; a night that
    would get a negative weight gets none (weights fixed by the variances alone keep it an e-value)."""
    if delta <= 0 or not nights:
        return 0.0
    excess = np.array([night.excess for night in nights])
    variance = np.maximum([night.variance for night in nights], 1e-12)
    shared = np.minimum([night.shared for night in nights], variance)
    covariance = np.minimum.outer(shared, shared)
    np.fill_diagonal(covariance, variance)
    weights = np.clip(np.linalg.lstsq(covariance, np.ones(len(nights)), rcond=None)[0], 0.0, None)
    if not weights.any():
        return 0.0
    mean_shift, spread = delta * weights.sum(), float(weights @ covariance @ weights)
    return float((mean_shift * (weights @ excess) - mean_shift * mean_shift / 2) / spread)


def leans_to_a_drop(evidence: dict[str, tuple[int, float]], tests: tuple[str, ...] | None = None) -> bool:
    """A cell's evidence (test -> (nights, log e)) is above 1 for some test (of `tests`, if given):
    its drops since it last passed came out beyond the midpoint of their margin and min_effect, on
    average."""
    return any(log_e > 0 for test, (_, log_e) in evidence.items() if tests is None or test in tests)


def rejects(log_e: float, alpha: float) -> bool:
    return log_e >= math.log(1 / alpha)


def describe(label: str, nights: int, log_e: float, alpha: float, launches: int = 1) -> str:
    shown = f"e={math.exp(min(log_e, 700)):.3g}" if log_e < 700 else f"log e={log_e:.0f}"
    verdict = f" >= 1/{alpha:.2g}" if rejects(log_e, alpha) else ""
    tonight = f"tonight's {launches} launches" if launches > 1 else "first launches"
    return f"evidence vs {label} over {nights} night(s) ({tonight}): {shown}{verdict}"
