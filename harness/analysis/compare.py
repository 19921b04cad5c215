"""Comparing two runs cell by cell (pure over loaded results).

Runs are named by run id, by results folder, or as `latest:<suite>` / `previous:<suite>` (the newest
and second-newest runs of a suite in the results folder). Cells are paired by cell id; accuracies
are compared on the questions both answered (exact McNemar), so a change of question count does
not pass for a change of accuracy. Runs with different protocol fingerprints are not comparable
unless the caller says so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum

from harness.errors import ConfigError
from harness.gate.stats import paired_comparison
from harness.gate.verdict import correctness
from harness.records import CellResult, Status
from harness.results.archive import LoadedRun
from harness.results.reporting import diverged_text, inline_code


class ChangeKind(str, Enum):
    """What happened to a cell between two runs; the order is how tables list them."""

    NEWLY_FAILING = "newly failing"
    STILL_FAILING = "still failing"
    CHANGED = "changed"  # another verdict, neither a regression nor fixed
    FIXED = "fixed"
    NEW = "new"
    REMOVED = "removed"
    STILL_UNDECIDED = "still undecided"  # the same error, inconclusive or skipped verdict
    STILL_PASSING = "still passing"

    def __str__(self) -> str:
        return self.value

    @property
    def rank(self) -> int:
        return list(ChangeKind).index(self)

    @property
    def css_class(self) -> str:
        return self.value.replace(" ", "-")


@dataclass(frozen=True)
class CellChange:
    cell_id: str
    before: CellResult | None
    after: CellResult | None
    shared: int
    difference: float | None  # after minus before, on shared questions
    p_value: float | None  # exact two-sided McNemar on shared questions
    change: ChangeKind


def change_kind(before: CellResult | None, after: CellResult | None) -> ChangeKind:
    if before is None:
        return ChangeKind.NEW
    if after is None:
        return ChangeKind.REMOVED
    was, now = before.status.is_regression, after.status.is_regression
    if now and not was:
        return ChangeKind.NEWLY_FAILING
    if was and not now:
        return ChangeKind.FIXED if after.status is Status.PASS else ChangeKind.CHANGED
    if now:
        return ChangeKind.STILL_FAILING
    if before.status == after.status == Status.PASS:
        return ChangeKind.STILL_PASSING
    return ChangeKind.CHANGED if before.status != after.status else ChangeKind.STILL_UNDECIDED


def compare_runs(before: LoadedRun, after: LoadedRun, allow_different_protocol: bool = False) -> list[CellChange]:
    """Every cell of either run, paired on shared questions under the newer run's gating extraction."""
    a, b = before.info.protocol_fingerprint, after.info.protocol_fingerprint
    if a != b and not allow_different_protocol:
        raise ConfigError(f"the runs used different protocols ({a} vs {b}: data, shots, questions, prompt or "
                          "decoding differ); pass --allow-different-protocol to compare anyway")
    extraction = after.info.extraction
    changes = []
    for cell_id in sorted(before.cells.keys() | after.cells.keys()):
        old, new = before.cells.get(cell_id), after.cells.get(cell_id)
        shared, difference, p_value = 0, None, None
        if old is not None and new is not None:
            paired = paired_comparison(correctness(after.questions(cell_id), extraction),
                                       correctness(before.questions(cell_id), extraction))
            if paired is not None:
                shared, difference = paired.n, paired.accuracy - paired.reference_accuracy
                p_value = paired.p_change
        changes.append(CellChange(cell_id, old, new, shared, difference, p_value, change_kind(old, new)))
    return changes


def _accuracy(result: CellResult | None) -> str:
    return "-" if result is None or result.accuracy is None else f"{result.accuracy:.3f}"


def changes_markdown(before: LoadedRun, after: LoadedRun, changes: list[CellChange]) -> str:
    lines = [f"# {inline_code(after.info.suite)}: {inline_code(after.info.run_id)} vs {inline_code(before.info.run_id)}", "",
             "| change | cell | before | after | diff (shared) | p | diverged (before → after) | status |",
             "|---|---|---|---|---|---|---|---|"]
    for change in sorted(changes, key=lambda c: (c.change.rank, c.cell_id)):
        diff = "-" if change.difference is None else f"{change.difference:+.3f} ({change.shared})"
        p_value = "-" if change.p_value is None else f"{change.p_value:.2g}"
        status = " → ".join(r.status.value if r else "-" for r in (change.before, change.after))
        lines.append(f"| {change.change} | {inline_code(change.cell_id)} | {_accuracy(change.before)} | {_accuracy(change.after)} "
                     f"| {diff} | {p_value} | {diverged_text(change.before)} → {diverged_text(change.after)} | {status} |")
    counts = Counter(change.change for change in changes)
    lines += ["", ", ".join(f"{counts[kind]} {kind}" for kind in ChangeKind if counts[kind])]
    return "\n".join(lines) + "\n"
