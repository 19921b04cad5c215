"""Model-wide tests (pure): did every cell of a model drop together against its own earlier runs?

A build that moves every cell of a model, its reference included, is invisible to the reference
test, and a slow one (half a point a night) shows in no single cell's history test for many nights:
each cell's drop against its history or pinned run carries a launch's spread or more. The model's
cells, taken together, carry it once per cell: the mean of m cells' drops has 1/m of their
variance. So each model is tested twice more, at its share of the run's alpha (harness.gate.budget):

    H0: the mean drop of the model's cells against their last runs (or the pinned run) <= history_margin

on the cells judged on answers that are not themselves a regression (a cell that failed on its own
would pull the mean down by its own bug), with at least MIN_CELLS of them. The mean's variance is
the sum of the cells' drop variances over m^2 (each cell's comparison is its own launches against
its own earlier launches). A rejection fails every one of those cells: the model moved, and the
reason says by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.gate.stats import Paired

MIN_CELLS = 3


@dataclass(frozen=True)
class ModelWide:
    model: str
    label: str  # "its last runs", "the pinned run"
    cells: int
    drop: float  # the cells' mean drop
    sd: float
    margin: float
    p: float
    alpha: float

    @property
    def rejected(self) -> bool:
        return self.p < self.alpha

    def describe(self) -> str:
        return (f"model-wide vs {self.label}: the {self.cells} cells of {self.model} that are not a regression dropped "
                f"{self.drop * 100:.2f} pts on average (sd {self.sd * 100:.2f}), p(drop > {self.margin * 100:.3g} pts)="
                f"{self.p:.2g}{' < ' + format(self.alpha, '.2g') if self.rejected else ''}")


def model_wide_test(model: str, label: str, drops: list[Paired], margin: float, alpha: float) -> ModelWide | None:
    """The test of `model`'s cells' paired drops against their earlier runs; None under MIN_CELLS."""
    from statistics import NormalDist

    if len(drops) < MIN_CELLS:
        return None
    m = len(drops)
    mean = sum(paired.drop for paired in drops) / m
    sd = math.sqrt(sum(paired.variance for paired in drops)) / m
    p = 1 - NormalDist().cdf((mean - margin) / sd) if sd > 0 else float(mean <= margin)
    return ModelWide(model, label, m, mean, sd, margin, p, alpha)
