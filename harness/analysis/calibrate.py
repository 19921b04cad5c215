"""Accuracies, floors, launch spreads and a pinned run from measured runs of a suite (pure): what
`regress calibrate` proposes.

A model's accuracy on a protocol is the mean test-split accuracy of its cells that were not a
regression (pass or inconclusive) across the runs read; its floor is that minus gate.floor_margin
(what the suite derives when it gives `accuracy` and no floor). A floor far under the model lets
a break of the whole model, its reference included, through on a first night (nothing else
compares it); hand-set floors a point too high make the same healthy cell undecided every night.
The lowest accuracy and the lowest 95% lower bound (Wilson) of any such cell are shown beside it.

A model's launch spread (ModelSpec.launch_sd) is what moves a cell's accuracy from one launch to
the next beyond its questions' sampling. Measured within runs (`propose_launch_spread_within`): the
launch samples every run records for a cell launched more than once (each reference's second
launch with gate.measure_launch_spread, every relaunch), pooled as the gate pools them
(harness.gate.launches): the same build, so nothing but launches moves it. Night to night
(`propose_launch_spread`, for runs that relaunched nothing): for each cell judged in two
consecutive runs, the paired drop d on the questions both answered and its sampling variance v
(discordance); within a pair of runs, each model's drops are centred on their mean (a build shift
common to every cell is the history test's to judge, not spread); then 2 launch_sd^2 = mean(centred
d^2) - mean(v), floored at 0. It also counts what a new build moves one cell and not the others
(a build is not a launch), so it reads high wherever builds change between the runs.

A divergence tolerance (nats per token, harness.gate.divergence) is proposed per model from its
passing cells' recorded 95th percentile of per-question divergence from their reference: the
highest of them, per pair of attention backends (the cell's and its reference's) and over all
pairs, times 1.5 and rounded up to two significant digits. A healthy cell then has about 5% of its
questions beyond it, half the 10% the test's null hypothesis allows, so healthy nights stay green
while a bug that moves most questions is still far beyond it.

The self-checks' tolerance (gate.self_checks.tolerance, one for the suite: how far a cell's own
numbers move between batches, warm and cold, or decode and prefill) by the same rule from the 95th percentile each
passing cell recorded of its co-batch, cache and decode checks (`propose_self_check_tolerance`).

The pinned run proposed is the newest run in which every cell that ran passed: a good night that
every later night is also paired with (gate.pinned_run), so that a slow drift cannot pass unseen
(`pinned_run: auto` pins the first run of the protocol that was not red instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.gate.launches import SpreadEstimate, centred_sample, drop_with_variance, pooled_spread
from harness.gate.stats import paired_comparison, wilson_interval
from harness.gate.verdict import correctness, first_launch
from harness.records import CellResult, RunInfo, Status
from harness.results.archive import RunArchive


@dataclass(frozen=True)
class FloorProposal:
    model: str
    runs: int  # runs that had a cell of the model that was not a regression
    cells: int  # such cell results read
    mean: float  # their mean test-split accuracy: the proposed `accuracy`
    lowest: float  # the lowest accuracy of such a cell
    lowest_bound: float  # the lowest 95% lower bound of such a cell
    current: float
    proposed: float  # mean - floor_margin, rounded down to the thousandth

    @property
    def change(self) -> str:
        if math.isclose(self.proposed, self.current):
            return "keep"
        return "raise" if self.proposed > self.current else "lower"


MEASURED = (Status.PASS, Status.INCONCLUSIVE)  # judged on answers and not a regression


def propose_floors(runs: list[tuple[RunInfo, list[CellResult]]], current: dict[str, float],
                   floor_margin: float = 0.03) -> list[FloorProposal]:
    """One proposal per model of `current` (model id -> floor now) that has measured cells in `runs`."""
    proposals = []
    for model, floor in current.items():
        measured = [(info.run_id, _test_split(cell)) for info, cells in runs for cell in cells
                    if cell.model == model and cell.status in MEASURED and cell.n > 0]
        if not measured:
            continue
        bounds = [wilson_interval(correct, n)[0] for _, (correct, n) in measured]
        accuracies = [correct / n for _, (correct, n) in measured]
        mean = sum(accuracies) / len(accuracies)
        proposals.append(FloorProposal(model=model, runs=len({run for run, _ in measured}), cells=len(measured),
                                       mean=mean, lowest=min(accuracies), lowest_bound=min(bounds), current=floor,
                                       proposed=math.floor((mean - floor_margin) * 1000) / 1000))
    return proposals


@dataclass(frozen=True)
class LaunchPair:
    """One cell judged in two consecutive runs, on the questions both answered."""

    model: str
    runs: tuple[str, str]
    losses: int
    gains: int
    n: int

    @property
    def drop_and_variance(self) -> tuple[float, float, int]:
        return drop_with_variance(self.losses, self.gains, self.n)


def night_to_night_pairs(archive: RunArchive, measured: list[tuple[RunInfo, list[CellResult]]],
                         extraction: str) -> list[LaunchPair]:
    """Each cell judged on answers (not a regression) in two consecutive runs of `measured` (oldest
    first), its first launches paired."""
    pairs = []
    for (before, before_cells), (after, after_cells) in zip(measured, measured[1:], strict=False):
        earlier = {cell.cell_id: cell for cell in before_cells if cell.status in MEASURED}
        for cell in after_cells:
            if cell.status not in MEASURED or cell.cell_id not in earlier:
                continue
            paired = paired_comparison(
                correctness(first_launch(archive.questions(after.run_id, cell.cell_id)), extraction),
                correctness(first_launch(archive.questions(before.run_id, cell.cell_id)), extraction))
            if paired is not None:
                pairs.append(LaunchPair(model=cell.model, runs=(before.run_id, after.run_id), losses=paired.losses,
                                        gains=paired.gains, n=paired.n))
    return pairs


@dataclass(frozen=True)
class LaunchSpread:
    model: str
    pairs: int
    launch_sd: float


def propose_launch_spread(pairs: list[LaunchPair]) -> list[LaunchSpread]:
    """Each model's launch spread from its cells' pairs of consecutive launches (module docstring):
    the gate's own night-to-night estimator (harness.gate.launches.centred_sample), pooled."""
    by_model: dict[str, dict[tuple[str, str], list[LaunchPair]]] = {}
    for pair in pairs:
        if pair.n > 0:
            by_model.setdefault(pair.model, {}).setdefault(pair.runs, []).append(pair)
    found = []
    for model, groups in by_model.items():
        samples = [centred_sample([pair.drop_and_variance for pair in group]) for group in groups.values()]
        estimate = pooled_spread([sample for sample in samples if sample is not None])
        if estimate is not None:
            found.append(LaunchSpread(model=model, pairs=sum(len(g) for g in groups.values() if len(g) > 1),
                                      launch_sd=estimate.sd))
    return found


@dataclass(frozen=True)
class WithinSpread:
    model: str
    estimate: SpreadEstimate  # pooled over the runs' launch samples of the model's cells


def propose_launch_spread_within(runs: list[tuple[RunInfo, list[CellResult]]]) -> list[WithinSpread]:
    """Each model's launch spread from the launch samples its cells recorded in `runs` (module docstring)."""
    samples: dict[str, list] = {}
    for _, cells in runs:
        for cell in cells:
            if cell.launch_sample is not None:
                samples.setdefault(cell.model, []).append(cell.launch_sample)
    found = []
    for model, model_samples in samples.items():
        estimate = pooled_spread(model_samples)
        if estimate is not None:
            found.append(WithinSpread(model, estimate))
    return found


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


@dataclass(frozen=True)
class SelfCheckProposal:
    checks: dict[str, float]  # check (co-batch, cache, decode) -> the highest 95th percentile of a passing cell
    cells: int
    current: float | None  # gate.self_checks.tolerance now (None: each model's divergence tolerance)
    proposed: float


def propose_self_check_tolerance(runs: list[tuple[RunInfo, list[CellResult]]],
                                 current: float | None) -> SelfCheckProposal | None:
    """gate.self_checks.tolerance from the passing cells' recorded 95th percentile of their sampled
    questions' divergence, co-batch, cache and decode together: the highest, times 1.5, rounded up to two
    significant digits (the divergence tolerance's rule). None when no passing cell recorded one, or
    none moved at all (there is no healthy spread to scale)."""
    highs: dict[str, float] = {}
    cells = 0
    for _, results in runs:
        for cell in results:
            if cell.status is not Status.PASS or not cell.self_check_high:
                continue
            cells += 1
            for name, high in cell.self_check_high.items():
                highs[name] = max(highs.get(name, 0.0), high)
    if not highs or max(highs.values()) <= 0:
        return None
    return SelfCheckProposal(dict(sorted(highs.items())), cells, current,
                             _round_up(DIVERGENCE_MARGIN * max(highs.values())))


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

