"""The statistics written without scipy agree with scipy's own (which the rest of the gate uses)."""

from __future__ import annotations

import itertools

import pytest
from scipy.stats import binomtest

from harness.gate.stats import below_floor_p


@pytest.mark.parametrize("n", [1, 6, 20, 200, 1319, 8792])
def test_the_floor_test_is_scipys_exact_binomial_test(n):
    for floor, share in itertools.product((0.05, 0.5, 0.72, 0.875, 0.899, 0.99), (0.0, 0.1, 0.5, 0.85, 0.9, 1.0)):
        correct = round(share * n)
        ours, theirs = below_floor_p(correct, n, floor), float(binomtest(correct, n, floor, alternative="less").pvalue)
        if theirs > 1e-290:
            assert ours == pytest.approx(theirs, rel=1e-9), (correct, n, floor)
        else:
            assert ours <= 1e-290, (correct, n, floor)


def test_the_floor_tests_edges():
    assert below_floor_p(0, 0, 0.9) == 1.0 and below_floor_p(3, 10, 0.0) == 1.0
    assert below_floor_p(10, 10, 1.0) == 1.0 and below_floor_p(9, 10, 1.0) == 0.0


@pytest.mark.parametrize("n", [1, 20, 40, 200, 1319])
def test_the_divergence_test_is_scipys_exact_binomial_test(n):
    from harness.gate.divergence import beyond_p

    for healthy, share in itertools.product((0.01, 0.1, 0.3), (0.0, 0.05, 0.1, 0.2, 0.9, 1.0)):
        beyond = round(share * n)
        ours = beyond_p(beyond, n, healthy)
        theirs = float(binomtest(beyond, n, healthy, alternative="greater").pvalue) if beyond else 1.0
        if theirs > 1e-290:
            assert ours == pytest.approx(theirs, rel=1e-9), (beyond, n, healthy)
        else:
            assert ours <= 1e-290, (beyond, n, healthy)
