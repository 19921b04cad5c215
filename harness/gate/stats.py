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

import numpy as np

from harness.gate.launches import Answers, drop_with_variance


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
    """A cell against another side (its reference, its own earlier runs) on the questions both answered.
    With several launches on a side (harness.gate.launches), a question counts by the share of that
    side's launches that answered it right, so `losses` and `gains` may be fractional."""

    n: int
    agreement: float
    losses: float  # the other side right, the cell wrong
    gains: float  # the cell right, the other side wrong
    accuracy: float
    reference_accuracy: float
    drop: float  # the other side's accuracy minus the cell's
    drop_ci: tuple[float, float]
    margin: float  # the null hypothesis: drop <= margin
    p_drop: float  # one-sided: the drop exceeds `margin` (see drop_above_margin_p)
    launch_sd: float = 0.0  # one launch's accuracy spread beyond its questions (harness.gate.launches)
    launches: tuple[float, float] = (1, 1)  # the cell's, the other side's (effective: harness.gate.launches)
    # With a side of several launches: the drop's variance from its questions (the per-question
    # differences' sample variance over n, at least 1/n^2); None: one launch a side (Tango's score).
    sampling_variance: float | None = None

    @property
    def launch_variance(self) -> float:
        """What the two sides' launches add to the drop's variance: launch_sd^2 (1/k + 1/m)."""
        return launch_variance(self.launch_sd, self.launches)

    @property
    def variance(self) -> float:
        """The drop's variance: its questions' (as observed) and both sides' launches'."""
        sampling = self.sampling_variance if self.sampling_variance is not None else _drop_sd(
            self.losses, self.gains, self.n) ** 2
        return max(sampling, 1 / self.n**2) + self.launch_variance

    @property
    def p_change(self) -> float:
        """Exact two-sided McNemar: a change either way (what `compare` reports; the gate needs none)."""
        from scipy.stats import binomtest

        losses, gains = round(self.losses), round(self.gains)
        discordant = losses + gains
        return float(binomtest(losses, discordant, 0.5).pvalue) if discordant else 1.0

    def drop_upper(self, confidence: float) -> float:
        """One-sided upper confidence bound of the drop: the largest drop d that Tango's score test of
        "drop >= d" does not reject at 1 - confidence (with both sides' launch spread added to its
        variance). A score bound, not the Wald bound drop + z sd: with a few tens of discordant
        answers the Wald bound is too low exactly when losses came out low by chance (its sd shrinks
        with them), and a cell that truly dropped min_effect would pass too often. With a side of
        several launches (fractional answers, no trinomial to restrict): drop + z sd, the sd from
        the per-question differences and the launches."""
        from scipy.stats import norm

        critical = float(norm.ppf(confidence))
        if self.sampling_variance is not None:
            return self.drop + critical * math.sqrt(self.sampling_variance + self.launch_variance)
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
        variance = (2 * rate + margin * (1 - margin)) / self.n + self.launch_variance
        return (margin - self.drop) / math.sqrt(max(variance, 1e-300))


def launch_variance(launch_sd: float, launches: tuple[float, float] = (1, 1)) -> float:
    """launch_sd^2 (1/k + 1/m): each side's mean over its launches carries launch_sd^2 / launches."""
    return launch_sd**2 * sum(1 / max(k, 1) for k in launches)


def _drop_sd(losses: float, gains: float, n: int) -> float:
    """Standard error of the paired drop (losses - gains) / n on n pairs."""
    return math.sqrt(drop_with_variance(losses, gains, n)[1])


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


def drop_above_margin_p(losses: float, gains: float, n: int, margin: float, launch_sd: float = 0.0,
                        launches: tuple[float, float] = (1, 1)) -> float:
    """One-sided p-value for "the paired drop exceeds `margin`" on n pairs.

    margin 0: McNemar's exact test (the discordant pairs split 50/50 under no drop). margin > 0:
    the exact tail of Tango's score statistic at the null's fitted gain rate (`_exact_tail`).
    `launch_sd` > 0, or a side of several launches (fractional counts): each launch also moves its
    accuracy by N(0, launch_sd) whatever its questions (another node, autotuned kernels): the score
    statistic's variance gains launch_sd^2 (1/k + 1/m) and its tail is normal (the launches' part is
    continuous; a fractional count has no exact tail)."""
    from scipy.stats import binomtest, norm

    if launch_sd > 0:
        rate = float(_null_gain_rate(float(losses), float(gains), n, margin))
        variance = (2 * rate + margin * (1 - margin)) / n + launch_variance(launch_sd, launches)
        return float(norm.sf(((losses - gains) / n - margin) / math.sqrt(max(variance, 1e-300))))
    losses, gains = int(losses), int(gains)
    if margin == 0:
        discordant = losses + gains
        return float(binomtest(losses, discordant, 0.5, alternative="greater").pvalue) if discordant else 1.0
    return _exact_tail(losses, gains, n, margin)


def paired_comparison(cell: dict[int, bool] | Answers, reference: dict[int, bool] | Answers, margin: float = 0.0,
                      confidence: float = 0.95, launch_sd: float = 0.0) -> Paired | None:
    """Losses and gains against the other side on shared questions, the test of "drop > margin",
    and a normal interval for the paired drop. A side given as `Answers` may hold several launches
    (a question then counts by the share of launches that got it right)."""
    from scipy.stats import norm

    mine = cell if isinstance(cell, Answers) else Answers.binary(cell)
    other = reference if isinstance(reference, Answers) else Answers.binary(reference)
    _, in_mine, in_other = np.intersect1d(mine.questions, other.questions, assume_unique=True, return_indices=True)
    n = len(in_mine)
    if n == 0:
        return None
    mine_right, other_right = mine.right[in_mine], other.right[in_other]
    differences = other_right - mine_right
    losses = float(differences[differences > 0].sum())
    gains = float(-differences[differences < 0].sum())
    cell_accuracy = float(mine_right.sum()) / n
    reference_accuracy = float(other_right.sum()) / n
    mine_shared = np.zeros(mine.n, dtype=bool)
    mine_shared[in_mine] = True
    other_shared = np.zeros(other.n, dtype=bool)
    other_shared[in_other] = True
    launches = (mine.effective_launches(mine_shared), other.effective_launches(other_shared))
    launch_part = launch_variance(launch_sd, launches)
    critical = float(norm.ppf(0.5 + confidence / 2))
    discordant = losses + gains
    if mine.is_binary and other.is_binary:
        losses, gains = round(losses), round(gains)  # whole counts: the exact tests apply
        drop = (losses - gains) / n
        half = critical * math.sqrt(_drop_sd(losses, gains, n) ** 2 + launch_part)
        return Paired(n=n, agreement=1 - discordant / n, losses=losses, gains=gains, accuracy=cell_accuracy,
                      reference_accuracy=reference_accuracy, drop=drop, drop_ci=(drop - half, drop + half),
                      margin=margin, p_drop=drop_above_margin_p(losses, gains, n, margin, launch_sd, launches),
                      launch_sd=launch_sd, launches=launches)
    # Several launches on a side: the questions' part of the variance from the per-question
    # differences themselves (at least one question's worth, 1/n^2, so that a deterministic server
    # whose launches all agree on a few questions is not taken for a sure thing).
    drop = float(differences.sum()) / n
    spread = float(((differences - drop) ** 2).sum()) / max(n - 1, 1)
    sampling = max(spread / n, 1 / n**2)
    sd = math.sqrt(sampling + launch_part)
    return Paired(n=n, agreement=1 - discordant / n, losses=losses, gains=gains, accuracy=cell_accuracy,
                  reference_accuracy=reference_accuracy, drop=drop, drop_ci=(drop - critical * sd, drop + critical * sd),
                  margin=margin, p_drop=float(norm.sf((drop - margin) / sd)), launch_sd=launch_sd, launches=launches,
                  sampling_variance=sampling)
