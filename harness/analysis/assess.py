"""What a CI job should say about a finished run: one headline and the job's exit code.

    1  regressions: some cell is `fail` or `mismatch`
    4  broken: more than `max_error_share` of the measured cells are `error`, or a reference cell is
       (every cell compared with it lost its paired test), so the night tested too little to be green
    3  undecided: some cell stayed `inconclusive` after every extension and relaunch the suite allows:
       nothing is known to be broken, but the night did not show those cells healthy. The headline
       says UNDECIDED, names them and what would decide each (another launch, more questions); the
       CI job turns it into a neutral check, never a plain success
    0  green: every measured cell passed (errors below the share are named)

The headline is the first line of the job's report, so a person reading the CI page knows at once
what happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.records import CellResult, ExitCode, Status


@dataclass(frozen=True)
class Assessment:
    exit_code: ExitCode
    headline: str


def assess(results: list[CellResult], max_error_share: float = 0.1) -> Assessment:
    """The job's verdict over a run's cells (the latest line per cell)."""
    measured = [r for r in results if r.status is not Status.SKIPPED]
    regressions = [r for r in measured if r.status.is_regression]
    errors = [r for r in measured if r.status is Status.ERROR]
    broken_references = [r for r in errors if r.reference_cell is None]
    undecided = [r for r in measured if r.status is Status.INCONCLUSIVE]
    tail = []
    if undecided:
        most = max((r.launches for r in undecided), default=1)
        named = ", ".join(f"{r.cell_id} ({r.decide or 'see its reason'})" for r in undecided[:5])
        tail.append(f"{len(undecided)} undecided after {most} launch(es) and the questions the suite allows: "
                    + named + (" ..." if len(undecided) > 5 else ""))
    if errors:
        tail.append(f"{len(errors)} could not be measured")
    suffix = ("; " + "; ".join(tail)) if tail else ""
    if regressions:
        names = ", ".join(r.cell_id for r in regressions[:5]) + (" ..." if len(regressions) > 5 else "")
        return Assessment(ExitCode.REGRESSIONS, f"REGRESSIONS: {len(regressions)} of {len(measured)} cells fail or "
                                       f"mismatch ({names}){suffix}")
    if measured and (len(errors) / len(measured) > max_error_share or broken_references):
        why = (f"reference cell(s) {', '.join(r.cell_id for r in broken_references)} could not be measured"
               if broken_references else f"more than {max_error_share:.0%} of the cells")
        return Assessment(ExitCode.BROKEN, f"BROKEN RUN: {len(errors)} of {len(measured)} cells could not be measured "
                                  f"({why}); first: {errors[0].cell_id}: {errors[0].reason.splitlines()[0][:200]}")
    passed = sum(r.status is Status.PASS for r in measured)
    if undecided:
        return Assessment(ExitCode.UNDECIDED, f"UNDECIDED: {passed} of {len(measured)} cells pass{suffix}")
    return Assessment(ExitCode.GREEN, f"GREEN: {passed} of {len(measured)} cells pass{suffix}")
