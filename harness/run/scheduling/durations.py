"""How long a cell will hold its GPUs, learned from the previous run and from this one.

The scheduler needs these twice: to order the queue (longest GPU-time first) and to decide whether
a narrow cell can run on a node held for a wide one without delaying it (backfilling). A guess that
is wrong only costs some packing; none at all (a new suite) makes the scheduler conservative.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from harness.records import CellResult, Timings
from harness.suite.matrix import Cell


def held_s(timings: Timings) -> float | None:
    """Seconds a finished cell held its GPUs (server start to stop), None when not recorded."""
    if timings.started_at is not None and timings.ended_at is not None:
        return timings.ended_at - timings.started_at
    held = timings.total_s - timings.queued_s
    return held if held > 0 else None


class Durations:
    """Expected GPU-holding seconds per cell: the same cell in the previous run, else the cells of
    the same model that ran to the end (in this run first: the same machines and build), else None."""

    def __init__(self, history: list[CellResult] = ()) -> None:
        self._cell: dict[str, float] = {}
        self._model_history: dict[str, list[float]] = defaultdict(list)
        self._model_now: dict[str, list[float]] = defaultdict(list)
        for result in history:
            seconds = held_s(result.timings)
            if seconds is None:
                continue
            self._cell[result.cell_id] = seconds
            if not result.stopped_early:
                self._model_history[result.model].append(seconds)

    def learn(self, cell: Cell, seconds: float, stopped_early: bool) -> None:
        """A cell of this run finished after holding its GPUs `seconds`."""
        if not stopped_early:
            self._model_now[cell.model.id].append(seconds)

    def expect(self, cell: Cell) -> float | None:
        if cell.cell_id in self._cell:
            return self._cell[cell.cell_id]
        for learned in (self._model_now, self._model_history):
            if learned.get(cell.model.id):
                return fmean(learned[cell.model.id])
        return None

    def typical(self) -> float | None:
        """The mean over every known duration: a stand-in for cells nothing is known of."""
        known = [*self._cell.values(), *(s for v in self._model_now.values() for s in v)]
        return fmean(known) if known else None
