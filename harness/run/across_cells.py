"""Judgements over several cells of a run, after its first pass (Gating keeps the verdicts; these
read them and fail cells through `Gating.override`):

- a reference its cells all diverge from alike, while they agree with one another, is the broken
  one (`name_broken_references`): a healthy cell is never `fail` only because it differs from it;
- each model's cells together against their history and their pin (`judge_models`,
  harness.gate.model_wide): a shift of the whole model, reference included.
"""

from __future__ import annotations

from harness.gate.divergence import divergence_test
from harness.gate.launches import Answers
from harness.gate.model_wide import model_wide_test
from harness.gate.stats import paired_comparison
from harness.gate.verdict import HISTORY_LABEL, PINNED_LABEL, first_launch
from harness.records import CellOutcome, CellResult, Status
from harness.run.gating import Gating
from harness.suite.matrix import Cell


def name_broken_references(gating: Gating, cells: dict[str, Cell]) -> None:
    """A reference from which every one of its cells (two or more) diverges alike, while they agree
    with one another, is the broken one: it fails ("reference broken"), and its cells are judged
    again without it (`inconclusive` where nothing else failed them)."""
    results = gating.results()
    dependents: dict[str, list[str]] = {}
    for cell_id, cell in cells.items():
        if cell.reference_cell and cell_id in results:
            dependents.setdefault(cell.reference_cell, []).append(cell_id)
    for reference_id, cell_ids in sorted(dependents.items()):
        reference = results.get(reference_id)
        found = [results[c] for c in cell_ids]
        if (reference is None or reference.status is not Status.PASS or len(found) < 2
                or not all(r.failed == ["divergence"] for r in found)):
            continue
        agreement = _agreement(gating, [gating.answers(c) for c in cell_ids])
        if agreement is None:
            continue
        shares = [r.divergence_share or 0 for r in found]
        gating.override(reference, f"reference broken: all {len(found)} of its cells diverge from it (teacher-forced, "
                                   f"{min(shares):.0%}-{max(shares):.0%} of their questions beyond the tolerance) and "
                                   f"agree with one another ({agreement})", ["reference broken"])
        for cell_id in cell_ids:
            outcome = gating.answers(cell_id)
            if outcome is not None:
                gating.judge(cells[cell_id], outcome, "", stage=gating.results()[cell_id].stage)


def _agreement(gating: Gating, outcomes: list[CellOutcome | None]) -> str | None:
    """How the first cell's teacher-forced answers compare with each other cell's, when every pair
    shares questions and has at most the healthy share of them beyond the tolerance."""
    if any(o is None for o in outcomes):
        return None
    spec = gating.gate.divergence
    first, shares = outcomes[0], []
    for other in outcomes[1:]:
        found = divergence_test(first_launch(first.questions), first_launch(other.questions), spec.tolerance,
                                spec.healthy_share)
        if found is None or found.share > spec.healthy_share:
            return None
        shares.append(found.share)
    return f"at most {max(shares):.0%} of their questions beyond the tolerance between them"


def judge_models(gating: Gating, models: int) -> None:
    """The model-wide tests over every model's cells judged on answers that are not a regression; a
    rejected one fails those cells."""
    alpha = gating.budget.model_test(models)
    if alpha <= 0:
        return
    by_model: dict[str, list[CellResult]] = {}
    for result in gating.results().values():
        if result.status in (Status.PASS, Status.INCONCLUSIVE) and gating.answers(result.cell_id) is not None:
            by_model.setdefault(result.model, []).append(result)
    extraction, margin = gating.gate.extraction, gating.gate.own_margin
    for model, results in sorted(by_model.items()):
        launch_sd = gating.launch_sd(model, gating.prior(model))
        found: dict[str, list] = {HISTORY_LABEL: [], PINNED_LABEL: []}
        for result in results:
            answers = Answers.of(gating.answers(result.cell_id).questions, extraction)
            baseline = gating.history.baseline(result.cell_id, before_streak=True)
            pinned = gating.history.pinned(result.cell_id)
            for label, runs in ((HISTORY_LABEL, baseline.outcomes if baseline else ()),
                                (PINNED_LABEL, (pinned[1],) if pinned else ())):
                if runs:
                    paired = paired_comparison(answers, Answers.pooled([r.questions for r in runs], extraction),
                                               margin, launch_sd=launch_sd)
                    if paired is not None:
                        found[label].append(paired)
        for label, drops in found.items():
            test = model_wide_test(model, label, drops, margin, alpha)
            if test is not None and test.rejected:
                for result in results:
                    gating.override(result, test.describe(), [*result.failed, "model-wide"])
                break
