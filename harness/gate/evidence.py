"""Evidence that accumulates across nights (pure): an e-process per cell and test.

One night's launch cannot tell a 3-point drop from launch spread at the alpha a run gives one test;
three nights of it can, if their evidence is combined without spending alpha again each night. A
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
launch asks other questions), and V uses the measured launch spread: the least-favourable rows of
benchmarks/gate_calibration.py measure what the approximation costs. A cell's product runs over its
consecutive nights since it last passed (a pass starts it again at 1) and is kept in cells.jsonl
(`evidence`), each night's factor at the cell's last stage that night (the one tested then).

The restart is chosen by the nights themselves, so the product since the last pass is no fixed
product; it is one of the products over tonight's trailing nights, and where the nights' factors
are independent (each night launches the cell and its reference anew) the largest of those reaches
1/alpha with chance at most alpha (Ville's inequality, read backwards in time). The history test's
nights share their baseline runs, so for it this holds only approximately: the least-favourable
rows of benchmarks/gate_calibration.py measure what it costs. Each stage at which the product is
tested spends its own share of the night's alpha, like any other test.
"""

from __future__ import annotations

import math

from harness.gate.stats import Paired

LABELS = {"reference": "reference", "history": "its last runs"}  # the tests that accumulate


def night_log_e(paired: Paired, min_effect: float) -> float:
    """The log e-value of one night's paired drop against its margin (module docstring)."""
    delta = min_effect - paired.margin
    if delta <= 0:
        return 0.0
    return (delta * (paired.drop - paired.margin) - delta * delta / 2) / max(paired.variance, 1e-12)


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
