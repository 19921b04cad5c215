"""Statistics over per-question records: the exact binomial tail and the Wilson interval (written
out), and the paired tests of "drop > margin" (McNemar's exact test; at a margin, the exact tail of
Tango's score statistic summed over the counts' trinomial with scipy's binomial pmf), and a score
upper bound of the paired drop.

scipy is imported inside the paired tests only: it costs ~1.5 s to import, and `regress eval` (one
server, no reference, a floor) should not wait for it after its last answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def preload() -> None:
    """Import scipy now: a long-running caller (the driver) would rather not pay for it in the
    middle of its scheduling loop, at the first verdict."""
    import scipy.stats  # noqa: F401


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion; (0, 1) when n is 0. Its closed form (what scipy's
    `proportion_ci(method="wilson")` computes), so that a caller that needs only this, `regress
    eval` without a floor, never pays for importing scipy."""
    if n == 0:
        return 0.0, 1.0
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    share = correct / n
    scale = 1 + z * z / n
    centre = (share + z * z / (2 * n)) / scale
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / scale
    return max(0.0, centre - half), min(1.0, centre + half)


def below_floor_p(correct: int, n: int, floor: float) -> float:
    """One-sided exact binomial p-value for "true accuracy < floor": P(X <= correct), X ~ Bin(n, floor),
    what scipy's `binomtest(..., alternative="less")` returns (the tests compare them), summed here
    in log space so that `regress eval`'s verdict does not wait 1.5 s for scipy.stats to import."""
    if n == 0 or floor <= 0.0:
        return 1.0
    if floor >= 1.0:
        return 1.0 if correct >= n else 0.0
    return min(1.0, binomial_cdf(correct, n, floor))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), 0 < p < 1, exact up to rounding: each term's logarithm, then
    their sum scaled by the largest (so that tails down to 1e-300 keep their digits)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    logs = [base - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q for i in range(k + 1)]
    top = max(logs)
    return math.exp(top) * math.fsum(math.exp(value - top) for value in logs)


@dataclass(frozen=True)
class Paired:
    """A cell against another side (its reference, its own earlier run) on the questions both answered."""

    n: int
    agreement: float
    losses: int  # the other side right, the cell wrong
    gains: int  # the cell right, the other side wrong
    accuracy: float
    reference_accuracy: float
    drop: float  # the other side's accuracy minus the cell's
    drop_ci: tuple[float, float]
    margin: float  # the null hypothesis: drop <= margin
    p_drop: float  # one-sided: the drop exceeds `margin` (see drop_above_margin_p)
    launch_sd: float = 0.0  # one launch's accuracy spread beyond its questions (harness.gate.stats)

    @property
    def p_change(self) -> float:
        """Exact two-sided McNemar: a change either way (what `compare` reports; the gate needs none)."""
        from scipy.stats import binomtest

        discordant = self.losses + self.gains
        return float(binomtest(self.losses, discordant, 0.5).pvalue) if discordant else 1.0

    def drop_upper(self, confidence: float) -> float:
        """One-sided upper confidence bound of the drop: the largest drop d that Tango's score test of
        "drop >= d" does not reject at 1 - confidence (with both launches' spread added to its
        variance). A score bound, not the Wald bound drop + z sd: with a few tens of discordant
        answers the Wald bound is too low exactly when losses came out low by chance (its sd shrinks
        with them), and a cell that truly dropped min_effect would pass too often."""
        from scipy.stats import norm

        critical = float(norm.ppf(confidence))
        low, high = self.drop, 1.0
        if self._score(high) < critical:
            return high
        for _ in range(60):  # bisection to ~1e-18: the score falls as d rises
            middle = (low + high) / 2
            low, high = (middle, high) if self._score(middle) < critical else (low, middle)
        return high

    def _score(self, margin: float) -> float:
        """(margin - drop) over the null's standard error at that margin: large when the drop is
        surely below `margin`."""
        rate = float(_null_gain_rate(float(self.losses), float(self.gains), self.n, margin))
        variance = (2 * rate + margin * (1 - margin)) / self.n + 2 * self.launch_sd**2
        return (margin - self.drop) / math.sqrt(max(variance, 1e-300))


def _drop_sd(losses: int, gains: int, n: int) -> float:
    """Standard error of the paired drop (losses - gains) / n on n pairs."""
    drop = (losses - gains) / n
    return math.sqrt(max((losses + gains) / n - drop**2, 0.0) / n)


def _null_gain_rate(losses, gains, n: int, margin: float):
    """Tango's restricted maximum-likelihood gain rate under "drop = margin" (arrays welcome)."""
    import numpy as np

    a = 2 * n
    b = -losses - gains + (2 * n - losses + gains) * margin
    c = -gains * margin * (1 - margin)
    return (-b + np.sqrt(np.maximum(b * b - 4 * a * c, 0.0))) / (2 * a)


def _tango_z(losses, gains, n: int, margin: float):
    """Tango's score statistic for "drop > margin" (Tango 1998, Statistics in Medicine 17:891)."""
    import numpy as np

    scale = np.sqrt(n * (2 * _null_gain_rate(losses, gains, n, margin) + margin * (1 - margin)))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (losses - gains - n * margin) / scale
    return np.where(scale > 0, z, np.where(losses - gains - n * margin > 0, np.inf, -np.inf))


# The exact tail sums over counts within this many sd (and 3 counts) of the null's means; the mass
# outside is far below any alpha a run's budget gives one test (1e-6 and up).
TAIL_SDS = 9.0


def _exact_tail(losses: int, gains: int, n: int, margin: float) -> float:
    """P(Tango's z >= the observed z) under "drop = margin", summed exactly over the trinomial of
    (losses, gains) at the null's fitted gain rate: Krishnamoorthy's E-test. The score test's
    normal tail is too small at the tiny alphas a run's budget gives a test when discordant pairs
    are few (it rejects up to 12x too often: benchmarks/gate_calibration.py --only size); this sum
    follows the counts' discreteness and skew instead (at most 1.03x there)."""
    import numpy as np
    from scipy.stats import binom

    observed = float(_tango_z(np.float64(losses), np.float64(gains), n, margin))
    gain_rate = float(_null_gain_rate(np.float64(losses), np.float64(gains), n, margin))
    loss_rate = min(gain_rate + margin, 1.0)
    g = _span(n * gain_rate, math.sqrt(n * gain_rate * (1 - gain_rate)), n)
    l_ = _span(n * loss_rate, math.sqrt(n * loss_rate * (1 - loss_rate)), n)
    grid_g, grid_l = np.meshgrid(g, l_, indexing="ij")
    possible = grid_g + grid_l <= n
    conditional = loss_rate / (1 - gain_rate) if gain_rate < 1 else 0.0
    mass = binom.pmf(grid_g, n, gain_rate) * binom.pmf(grid_l, n - grid_g, min(conditional, 1.0))
    z = _tango_z(grid_l.astype(float), grid_g.astype(float), n, margin)
    return float(min(1.0, np.sum(mass[possible & (z >= observed - 1e-9)])))


def _span(mean: float, sd: float, n: int):
    import numpy as np

    low = max(0, math.floor(mean - TAIL_SDS * sd - 3))
    return np.arange(low, min(n, math.ceil(mean + TAIL_SDS * sd + 3)) + 1)


def drop_above_margin_p(losses: int, gains: int, n: int, margin: float, launch_sd: float = 0.0) -> float:
    """One-sided p-value for "the paired drop exceeds `margin`" on n pairs.

    margin 0: McNemar's exact test (the discordant pairs split 50/50 under no drop). margin > 0:
    the exact tail of Tango's score statistic at the null's fitted gain rate (`_exact_tail`).
    `launch_sd` > 0: each side's launch also moves its accuracy by N(0, launch_sd) whatever its
    questions (another node, autotuned kernels): the score statistic's variance gains both
    launches' (2 launch_sd^2) and its tail is normal (the launches' part is continuous)."""
    from scipy.stats import binomtest, norm

    if launch_sd > 0:
        rate = float(_null_gain_rate(float(losses), float(gains), n, margin))
        variance = (2 * rate + margin * (1 - margin)) / n + 2 * launch_sd**2
        return float(norm.sf(((losses - gains) / n - margin) / math.sqrt(variance)))
    if margin == 0:
        discordant = losses + gains
        return float(binomtest(losses, discordant, 0.5, alternative="greater").pvalue) if discordant else 1.0
    return _exact_tail(losses, gains, n, margin)


def paired_comparison(cell: dict[int, bool], reference: dict[int, bool], margin: float = 0.0,
                      confidence: float = 0.95, launch_sd: float = 0.0) -> Paired | None:
    """Losses and gains against the other side on shared questions, the test of "drop > margin",
    and a normal interval for the paired drop."""
    from scipy.stats import norm

    shared = sorted(cell.keys() & reference.keys())
    n = len(shared)
    if n == 0:
        return None
    losses = sum(reference[i] and not cell[i] for i in shared)
    gains = sum(cell[i] and not reference[i] for i in shared)
    cell_accuracy = sum(cell[i] for i in shared) / n
    reference_accuracy = sum(reference[i] for i in shared) / n
    drop = (losses - gains) / n
    half = float(norm.ppf(0.5 + confidence / 2)) * _drop_sd(losses, gains, n)
    discordant = losses + gains
    return Paired(n=n, agreement=1 - discordant / n, losses=losses, gains=gains, accuracy=cell_accuracy,
                  reference_accuracy=reference_accuracy, drop=drop, drop_ci=(drop - half, drop + half),
                  margin=margin, p_drop=drop_above_margin_p(losses, gains, n, margin, launch_sd),
                  launch_sd=launch_sd)
