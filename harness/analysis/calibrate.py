"""Floors and a pinned run from measured runs of a suite (pure): what `regress calibrate` proposes.

A floor is the accuracy below which a model is broken on this protocol. Hand-set floors a point or
two too high make the same healthy cell red or inconclusive every night; too low, they catch less.
The proposal is the lowest 95% lower bound (Wilson) of any passing cell of the model across the
runs read, rounded down to the hundredth: every healthy cell measured so far was above it with
room for its own sampling noise, and the floor follows the protocol's size (1,319 questions give a
tighter bound than 200).

A divergence tolerance (nats per token, harness.gate.divergence) is proposed per model from its
passing cells' recorded 95th percentile of per-question divergence from their reference: the
highest of them, per pair of attention backends (the cell's and its reference's) and over all
pairs, times 1.5 and rounded up to two significant digits. A healthy cell then has about 5% of its
questions beyond it, half the 10% the test's null hypothesis allows, so healthy nights stay green
while a bug that moves most questions is still far beyond it.

The pinned run is the newest run in which every cell that ran passed: a good night that every
later night is also paired with (gate.pinned_run), so that a slow drift cannot pass unseen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.gate.stats import wilson_interval
from harness.records import CellResult, RunInfo, Status


@dataclass(frozen=True)
class FloorProposal:
    model: str
    runs: int  # runs that had a passing cell of the model
    cells: int  # passing cell results read
    mean: float
    lowest: float  # the lowest accuracy of a passing cell
    lowest_bound: float  # the lowest 95% lower bound of a passing cell
    current: float
    proposed: float

    @property
    def change(self) -> str:
        if math.isclose(self.proposed, self.current):
            return "keep"
        return "raise" if self.proposed > self.current else "lower"


def propose_floors(runs: list[tuple[RunInfo, list[CellResult]]], current: dict[str, float]) -> list[FloorProposal]:
    """One proposal per model of `current` (model id -> floor now) that has passing cells in `runs`."""
    proposals = []
    for model, floor in current.items():
        passing = [(info.run_id, _test_split(cell)) for info, cells in runs for cell in cells
                   if cell.model == model and cell.status is Status.PASS and cell.n > 0]
        if not passing:
            continue
        bounds = [wilson_interval(correct, n)[0] for _, (correct, n) in passing]
        accuracies = [correct / n for _, (correct, n) in passing]
        lowest_bound = min(bounds)
        proposals.append(FloorProposal(model=model, runs=len({run for run, _ in passing}), cells=len(passing),
                                       mean=sum(accuracies) / len(accuracies), lowest=min(accuracies),
                                       lowest_bound=lowest_bound, current=floor,
                                       proposed=math.floor(lowest_bound * 100) / 100))
    return proposals


DIVERGENCE_MARGIN = 1.5


@dataclass(frozen=True)
class DivergenceProposal:
    model: str
    pairs: dict[str, float]  # "cell backend vs reference backend" -> the highest 95th percentile seen
    cells: int
    current: float  # the model's tolerance now (its own, else the gate's)
    proposed: float


def _round_up(value: float) -> float:
    """Up to two significant digits (0.01234 -> 0.013)."""
    if value <= 0:
        return 1e-4
    digits = 1 - math.floor(math.log10(value))
    return math.ceil(value * 10 ** digits) / 10 ** digits


def propose_divergence(runs: list[tuple[RunInfo, list[CellResult]]], current: dict[str, float],
                       backend_axis: str = "attention_backend") -> list[DivergenceProposal]:
    """One proposal per model of `current` (model id -> tolerance now) with passing cells that were
    tested for divergence in `runs`."""
    proposals = []
    for model, tolerance in current.items():
        pairs: dict[str, float] = {}
        cells = 0
        for _, results in runs:
            by_id = {cell.cell_id: cell for cell in results}
            for cell in results:
                if cell.model != model or cell.status is not Status.PASS or cell.divergence_high is None:
                    continue
                reference = by_id.get(cell.reference_cell or "")
                pair = (f"{cell.factors.get(backend_axis, 'default')} vs "
                        f"{reference.factors.get(backend_axis, 'default') if reference else '?'}")
                pairs[pair] = max(pairs.get(pair, 0.0), cell.divergence_high)
                cells += 1
        if pairs:
            proposals.append(DivergenceProposal(model=model, pairs=dict(sorted(pairs.items())), cells=cells,
                                                current=tolerance,
                                                proposed=_round_up(DIVERGENCE_MARGIN * max(pairs.values()))))
    return proposals


def _test_split(cell: CellResult) -> tuple[int, int]:
    """(correct, n) on the test questions the floor is tested on (all answers for older results)."""
    return (cell.floor_correct, cell.floor_n) if cell.floor_n else (cell.correct, cell.n)


def pinnable_run(runs: list[tuple[RunInfo, list[CellResult]]]) -> RunInfo | None:
    """The newest finished run (of `runs`, oldest first) in which every cell that ran passed."""
    for info, cells in reversed(runs):
        ran = [cell for cell in cells if cell.status is not Status.SKIPPED]
        if ran and not info.interrupted and all(cell.status is Status.PASS for cell in ran):
            return info
    return None

