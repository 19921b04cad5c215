"""Comparing two runs cell by cell (pure over loaded results).

Runs are named by run id, by results folder, or as `latest:<suite>` / `previous:<suite>` (the newest
and second-newest runs of a suite in the results folder). Cells are paired by cell id; accuracies
are compared on the questions both answered (exact McNemar), so a change of question count does
not pass for a change of accuracy. Runs with different protocol fingerprints are not comparable
unless the caller says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.gate.stats import paired_comparison
from harness.gate.verdict import correctness
from harness.results.records import CellResult, RunInfo, Status
from harness.results.store import ResultsStore


@dataclass(frozen=True)
class LoadedRun:
    info: RunInfo
    cells: dict[str, CellResult]
    store: ResultsStore


@dataclass(frozen=True)
class CellChange:
    cell_id: str
    before: CellResult | None
    after: CellResult | None
    shared: int
    difference: float | None  # after minus before, on shared questions
    p_value: float | None  # exact two-sided McNemar on shared questions
    change: str  # newly failing, fixed, still failing, still passing, changed, new, removed


def runs_of(results_dir: Path, suite: str) -> list[RunInfo]:
    infos = []
    for path in Path(results_dir).glob(f"{suite}-*/run.json"):
        infos.append(RunInfo.model_validate_json(path.read_text()))
    return sorted((i for i in infos if i.suite == suite and not i.interrupted), key=lambda i: i.started_at)


def resolve_run(results_dir: Path, name: str) -> ResultsStore:
    """A run id, a results folder, or latest:<suite> / previous:<suite>."""
    if name.startswith(("latest:", "previous:")):
        which, _, suite = name.partition(":")
        infos = runs_of(results_dir, suite)
        needed = 1 if which == "latest" else 2
        if len(infos) < needed:
            raise ConfigError(f"{name}: {len(infos)} finished run(s) of suite {suite!r} in {results_dir}")
        return ResultsStore(results_dir, infos[-needed].run_id)
    path = Path(name)
    if (path / "run.json").is_file():
        return ResultsStore(path.parent, path.name)
    return ResultsStore.existing(results_dir, name)


def load_run(store: ResultsStore) -> LoadedRun:
    return LoadedRun(store.read_run(), {c.cell_id: c for c in store.cells()}, store)


def _change(before: CellResult | None, after: CellResult | None) -> str:
    if before is None:
        return "new"
    if after is None:
        return "removed"
    was, now = before.status.is_regression, after.status.is_regression
    if now and not was:
        return "newly failing"
    if was and not now:
        return "fixed" if after.status is Status.PASS else "changed"
    if now:
        return "still failing"
    if before.status == after.status == Status.PASS:
        return "still passing"
    return "changed" if before.status != after.status else f"still {after.status.value}"


def compare_runs(before: LoadedRun, after: LoadedRun, allow_different_protocol: bool = False,
                 extraction: str = "flexible") -> list[CellChange]:
    a, b = before.info.protocol_fingerprint, after.info.protocol_fingerprint
    if a != b and not allow_different_protocol:
        raise ConfigError(f"the runs used different protocols ({a} vs {b}: data, shots, questions, prompt or "
                          "decoding differ); pass --allow-different-protocol to compare anyway")
    changes = []
    for cell_id in sorted(before.cells.keys() | after.cells.keys()):
        old, new = before.cells.get(cell_id), after.cells.get(cell_id)
        shared, difference, p_value = 0, None, None
        if old is not None and new is not None:
            paired = paired_comparison(correctness(after.store.read_questions(cell_id), extraction),
                                       correctness(before.store.read_questions(cell_id), extraction))
            if paired is not None:
                shared, difference = paired.n, paired.accuracy - paired.reference_accuracy
                p_value = paired.p_change
        changes.append(CellChange(cell_id, old, new, shared, difference, p_value, _change(old, new)))
    return changes


def _accuracy(result: CellResult | None) -> str:
    return "-" if result is None or result.accuracy is None else f"{result.accuracy:.3f}"


def changes_markdown(before: LoadedRun, after: LoadedRun, changes: list[CellChange]) -> str:
    order = {"newly failing": 0, "still failing": 1, "changed": 2, "fixed": 3, "new": 4, "removed": 5}
    lines = [f"# {after.info.suite}: `{after.info.run_id}` vs `{before.info.run_id}`", "",
             "| change | cell | before | after | diff (shared) | p | status |", "|---|---|---|---|---|---|---|"]
    for change in sorted(changes, key=lambda c: (order.get(c.change, 9), c.cell_id)):
        diff = "-" if change.difference is None else f"{change.difference:+.3f} ({change.shared})"
        p_value = "-" if change.p_value is None else f"{change.p_value:.2g}"
        status = " → ".join(r.status.value if r else "-" for r in (change.before, change.after))
        lines.append(f"| {change.change} | `{change.cell_id}` | {_accuracy(change.before)} | {_accuracy(change.after)} "
                     f"| {diff} | {p_value} | {status} |")
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.change] = counts.get(change.change, 0) + 1
    lines += ["", ", ".join(f"{n} {name}" for name, n in sorted(counts.items(), key=lambda kv: order.get(kv[0], 9)))]
    return "\n".join(lines) + "\n"
