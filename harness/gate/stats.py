"""Statistics over per-question records (scipy's exact tests; no hand-rolled distributions).

scipy is imported inside the functions: it costs ~1.3 s to import, and `regress eval` should send its
first request well before a verdict is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def preload() -> None:
    """Import scipy now: a long-running caller (the driver) would rather not pay for it in the
    middle of its scheduling loop, at the first verdict."""
    import scipy.stats  # noqa: F401


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    interval = binomtest(correct, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(interval.low), float(interval.high)


def below_floor_p(correct: int, n: int, floor: float) -> float:
    """One-sided exact binomial p-value for "true accuracy < floor"."""
    if n == 0 or floor <= 0.0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(correct, n, floor, alternative="less").pvalue)


@dataclass(frozen=True)
class Paired:
    """A cell against its reference on the questions both answered."""

    n: int
    agreement: float
    losses: int  # reference right, cell wrong
    gains: int  # cell right, reference wrong
    accuracy: float
    reference_accuracy: float
    drop: float  # reference accuracy minus cell accuracy
    drop_ci: tuple[float, float]
    margin: float  # the null hypothesis: drop <= margin
    p_drop: float  # one-sided: the drop exceeds `margin` (exact McNemar when the margin is 0)

    @property
    def p_change(self) -> float:
        """Exact two-sided McNemar: a change either way (what `compare` reports; the gate needs none)."""
        from scipy.stats import binomtest

        discordant = self.losses + self.gains
        return float(binomtest(self.losses, discordant, 0.5).pvalue) if discordant else 1.0

    def drop_upper(self, confidence: float) -> float:
        """One-sided upper confidence bound of the drop (normal approximation, as `drop_ci`)."""
        from scipy.stats import norm

        return self.drop + float(norm.ppf(confidence)) * _drop_sd(self.losses, self.gains, self.n)


def _drop_sd(losses: int, gains: int, n: int) -> float:
    """Standard error of the paired drop (losses - gains) / n on n pairs."""
    drop = (losses - gains) / n
    return math.sqrt(max((losses + gains) / n - drop**2, 0.0) / n)


def drop_above_margin_p(losses: int, gains: int, n: int, margin: float) -> float:
    """One-sided p-value for "the paired drop exceeds `margin`" on n pairs.

    margin 0: McNemar's exact test (the discordant pairs split 50/50 under no drop). margin > 0:
    Tango's score test for a difference of paired proportions (Tango 1998, Statistics in Medicine
    17:891), which reduces to McNemar's z at margin 0 and keeps its size near nominal for the
    discordant counts GSM8K cells have (tens to hundreds)."""
    from scipy.stats import binomtest, norm

    if margin == 0:
        discordant = losses + gains
        return float(binomtest(losses, discordant, 0.5, alternative="greater").pvalue) if discordant else 1.0
    a = 2 * n
    b = -losses - gains + (2 * n - losses + gains) * margin
    c = -gains * margin * (1 - margin)
    gain_rate = (-b + math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a)  # restricted MLE under the null
    scale = math.sqrt(n * (2 * gain_rate + margin * (1 - margin)))
    return float(norm.sf((losses - gains - n * margin) / scale)) if scale > 0 else 1.0


def paired_comparison(cell: dict[int, bool], reference: dict[int, bool], margin: float = 0.0,
                      confidence: float = 0.95) -> Paired | None:
    """Losses and gains against the reference on shared questions, the test of "drop > margin",
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
                  margin=margin, p_drop=drop_above_margin_p(losses, gains, n, margin))
