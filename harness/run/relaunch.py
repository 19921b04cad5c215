"""The relaunch stages of the gate: undecided cells launched again, and judged on every launch.

What moves a cell between launches of its server (non-deterministic kernels, autotuning, another
node: the launch spread, harness.gate.launches) does not shrink with more questions. A cell still
`inconclusive` after its planned questions and the extension is launched again, on the same
questions, with its reference launched once more beside it (the reference's spread is in every
comparison with it), up to `gate.max_launches` launches in all; after each relaunch pass the
relaunched cells are judged again on all their launches, at the next stage of the budget
(harness.gate.budget). With `gate.measure_launch_spread`, the first pass launches every reference a
second time whatever the verdicts: each run then measures launch spread on its own.

The passes spend what the extension left of `gate.undecided_budget` (a share of the GPU-seconds
of the run's first pass: each launch's GPUs x the seconds its server held them). A relaunch is
expected to cost the cell's first launch on its questions (`Gating.launch_cost`). References go
first (every comparison with them gains), then undecided cells whose evidence from earlier nights
leans to a drop (`Gating.leaning_first`), then the rest in matrix order. A cell left over
stays `inconclusive` with the reason, and `regress assess` names it. Early stop does not look at
relaunches (its share of the budget was spent on the first launch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.console import Console

from harness.records import CellOutcome
from harness.run.gating import Gating
from harness.suite.matrix import Cell

if TYPE_CHECKING:
    from harness.run.build import RunInputs

Schedule = Callable[..., None]  # (cells, plan, on_outcome, label, looks=False): see pipeline._Schedule.run


def relaunch_plan(cells: dict[str, Cell], gating: Gating, first_pass: bool, measure: bool,
                  questions: Callable[[Cell], int]) -> tuple[list[Cell], list[Cell]]:
    """(cells to launch again, undecided cells left out for the budget): the undecided cells and
    their references, every reference on the first pass when `measure` (those are launched whatever
    the verdicts: launch-spread samples; harness.gate.launches). `questions`: what a cell's
    relaunch asks."""
    undecided = [cell for cell_id, cell in cells.items() if gating.undecided(cell_id)]

    references = {cell.reference_cell for cell in undecided if cell.reference_cell}
    if first_pass and measure:
        references |= {cell_id for cell_id, cell in cells.items() if cell.is_reference and gating.answers(cell_id)}
    wanted = [cells[cell_id] for cell_id in sorted(references) if cell_id in cells and gating.answers(cell_id)]
    wanted += gating.leaning_first([cell for cell in undecided if cell.cell_id not in references])
    # A cell leaning to a drop, and its reference, may draw on the reserve (`Gating.spend`).
    leaning = {c for cell in undecided if gating.leaning(cell.cell_id) for c in (cell.cell_id, cell.reference_cell) if c}
    chosen, left_out = [], []
    for cell in wanted:
        if gating.spend(gating.launch_cost(cell, questions(cell)), leaning=cell.cell_id in leaning):
            chosen.append(cell)
        elif gating.undecided(cell.cell_id):
            left_out.append(cell)
    return chosen, left_out


def relaunch(inputs: RunInputs, gating: Gating, schedule: Schedule) -> None:
    """Relaunch passes until every cell is decided, `gate.max_launches` is reached or the budget is spent."""
    gate = inputs.loaded.suite.gate
    if gate.max_launches < 2:
        return
    cells = inputs.matrix.by_id()
    extension = len(gating.extension_plan.prompts) if gating.extension_plan is not None else 0

    def questions(cell: Cell) -> int:
        return len(inputs.plan.prompts) + (extension if gating.was_extended(cell.cell_id) else 0)

    unlaunched: dict[str, Cell] = {}  # undecided cells the budget left out
    for launch in range(2, gate.max_launches + 1):
        eligible = {cell_id: cell for cell_id, cell in cells.items()
                    if gating.answers(cell_id) is not None and gating.relaunches(cell_id) == launch - 2}
        chosen, left_out = relaunch_plan(eligible, gating, launch == 2, gate.measure_launch_spread, questions)
        unlaunched.update((cell.cell_id, cell) for cell in left_out)
        if not chosen:
            break
        more: dict[str, CellOutcome] = {}
        collect = _collector(more)
        undecided = sum(gating.undecided(cell.cell_id) for cell in chosen)
        label = f"{inputs.loaded.suite.suite}: launch {launch} of {len(chosen)} cell(s) ({undecided} undecided)"
        # A cell that answered the extension is launched again on all its questions: every question
        # of its mean then rests on the same number of launches.
        extended = [cell for cell in chosen if gating.was_extended(cell.cell_id)]
        plain = [cell for cell in chosen if not gating.was_extended(cell.cell_id)]
        if plain:
            schedule(plain, inputs.plan, collect, label, looks=False)
        if extended and gating.extension_plan is not None:
            whole = replace(inputs.plan, prompts=inputs.plan.prompts + gating.extension_plan.prompts)
            schedule(extended, whole, collect, label + " on the extended questions", looks=False)
        judged = []
        measuring = launch == 2 and gate.measure_launch_spread
        for cell in chosen:
            outcome = more.get(cell.cell_id)
            if outcome is not None and outcome.score is not None and outcome.error is None and not outcome.mismatches:
                gating.relaunched(cell, outcome, measurement=measuring and cell.is_reference)
                judged.append(cell)
            elif gating.undecided(cell.cell_id):
                gating.note(cell, f"launch {launch} could not be measured: {_why(outcome)}")
        stage = gating.relaunch_stage(launch)
        # References first: every cell compared with one is then judged against all its launches.
        for cell in sorted(judged, key=lambda c: not c.is_reference):
            gating.rejudge(cell, note=f"launched {launch} times; ", stage=stage)
        # An undecided cell left out (the budget) is judged again too when its reference gained a
        # launch: the reference's own spread was part of what held it open.
        relaunched = {cell.cell_id for cell in judged}
        for cell_id, cell in cells.items():
            if cell_id not in relaunched and cell.reference_cell in relaunched and gating.undecided(cell_id):
                gating.rejudge(cell, note=f"its reference launched {launch} times; ", stage=stage)
    for cell_id, cell in unlaunched.items():
        if gating.undecided(cell_id):
            gating.note(cell, f"not launched again: the budget for undecided cells ({gate.undecided_budget:.0%} of "
                              "the first pass's GPU-seconds) was spent")


def _collector(more: dict[str, CellOutcome]) -> Callable[[Cell, CellOutcome, str, Console], None]:
    def collect(cell: Cell, outcome: CellOutcome, log: str, _: Console) -> None:
        more[cell.cell_id] = outcome

    return collect


def _why(outcome: CellOutcome | None) -> str:
    if outcome is None:
        return "no outcome came back"
    if outcome.error is not None:
        return outcome.error.message.splitlines()[0][:200]
    if outcome.mismatches:
        return "the server did not honour the configuration: " + "; ".join(outcome.mismatches)[:200]
    return "no question was answered"
