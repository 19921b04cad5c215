"""Stage 2 of the gate: undecided cells (and their references) are asked more questions up to
`gate.extend_to` in all (the test questions not asked yet, then train questions, never the shots)
and judged again on everything they answered, at the budget's stage-2 share (a later cells.jsonl
line replaces the earlier one for every reader). The extension runs on a server launch of its own:
its answers are another launch's (harness.gate.launches). It spends from gate.undecided_budget
(with the relaunches after it), cells whose evidence from earlier nights leans to a drop first
(`Gating.leaning_first`); a cell it leaves out says so. Early stop does not look at the
extension."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console

from harness.benchmark.base import ProtocolPlan
from harness.benchmark.registry import benchmark_named
from harness.records import CellOutcome
from harness.run.gating import Gating
from harness.suite.matrix import Cell

if TYPE_CHECKING:
    from harness.run.build import RunInputs

Schedule = Callable[..., None]  # (cells, plan, on_outcome, label): see pipeline._Schedule.run


def extend(inputs: RunInputs, gating: Gating, schedule: Schedule) -> None:
    """Extend every undecided cell (`Gating.extensible`) and its reference; no-op when there is none,
    or the protocol has no extension (sglang-fewshot, sglang-run-eval: their questions are fixed)."""
    cells = inputs.matrix.by_id()
    undecided = [cells[cell_id] for cell_id in gating.results() if cell_id in cells and gating.extensible(cell_id)]
    if not undecided:
        return
    plan: ProtocolPlan = inputs.plan
    benchmark = benchmark_named(inputs.loaded.suite.benchmark)
    extra = benchmark.extension(inputs.data, plan, inputs.loaded.suite.gate.extend_to - len(plan.prompts))
    if extra is None:
        return
    gating.extension_plan = extra
    extra_total = len(plan.prompts) + len(extra.prompts)
    # Within gate.undecided_budget: a cell goes with its reference (a reference once for all its cells).
    wanted: list[str] = []
    left_out = []
    for cell in gating.leaning_first(undecided):
        new = [cell_id for cell_id in (cell.reference_cell, cell.cell_id) if cell_id and cell_id not in wanted]
        if gating.spend(sum(gating.launch_cost(cells[cell_id], len(extra.prompts)) for cell_id in new),
                        leaning=gating.leaning(cell.cell_id)):
            wanted += new
        else:
            left_out.append(cell)
    for cell in left_out:
        gating.note(cell, f"not extended: the budget for undecided cells ({inputs.loaded.suite.gate.undecided_budget:.0%} "
                          "of the first pass's GPU-seconds) was spent")
    undecided = [cell for cell in undecided if cell.cell_id in wanted]
    if not undecided:
        return
    more: dict[str, CellOutcome] = {}

    def collect(cell: Cell, outcome: CellOutcome, log: str, _: Console) -> None:
        more[cell.cell_id] = outcome

    schedule([cells[cell_id] for cell_id in sorted(set(wanted)) if gating.answers(cell_id)], extra, collect,
             f"{inputs.loaded.suite.suite}: extending {len(undecided)} undecided cell(s) to {extra_total} questions")
    for cell_id, outcome in more.items():
        if outcome.score is not None and outcome.error is None:
            gating.extended(cells[cell_id], outcome)
    for cell in undecided:
        gating.rejudge(cell, note="extended to {n} questions; ")
