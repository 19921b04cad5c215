"""Keep the GPUs busy: run a list of cells on the slots of one pass, in the order expected to end soonest.

The loop: ask for slots the queue can use (`slots`), place what fits (`packing`), wait for the
first cell, slot or node event, learn the finished cell's duration and plan the rest of the queue
again (`forecast`). A cell whose worker dies is retried once, in its place in the queue (an
infrastructure failure, never an accuracy failure); after that it is `error`. Finished cells go
to the caller only once their GPUs have gone to the next cells, so that gating and writing never
hold a GPU idle.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.benchmark.base import ProtocolPlan
from harness.errors import ErrorKind
from harness.records import CellError, CellOutcome
from harness.run.cell import CellJob
from harness.run.ray.slots import Slot, SlotPool
from harness.run.scheduling.durations import Durations, held_s
from harness.run.scheduling.forecast import improve
from harness.run.scheduling.placement import Packer, Placement
from harness.suite.config import ClusterSpec
from harness.suite.matrix import Cell

WORKER_RETRIES = 1
# Forecast moves tried before the first placement, then after each finished cell; each is one
# play of the packer over the queue (0.6 ms for 48 cells on 2 nodes). Replayed on the durations of
# 8 benchmark runs (planned on one run, played on the next): 1,500/200 moves end 2.6% over the
# lower bound on average, 400/60 about 3.4%, the priority order alone 5.5%. Planning is capped in
# seconds and at a share of a typical cell's duration, so short cells do not wait on their plan.
PLAN_TRIES, REPLAN_TRIES = 1500, 200
PLAN_BUDGET_S, REPLAN_BUDGET_S = 2.0, 0.25
PLAN_SHARE, REPLAN_SHARE = 0.05, 0.01

OnOutcome = Callable[[Cell, CellOutcome, str, Console], None]


def _failed(cell: Cell, kind: ErrorKind, message: str) -> CellOutcome:
    return CellOutcome(cell_id=cell.cell_id, args=[], error=CellError(kind=kind, message=message))


class Interrupted(BaseException):
    """SIGTERM or Ctrl-C, raised like KeyboardInterrupt so that no `except Exception` swallows it."""


@dataclass
class _Running:
    placement: Placement
    slots: list[Slot]  # the first leads: the server runs in its process
    run_ref: Any
    attempt: int

    @property
    def cell(self) -> Cell:
        return self.placement.cell


class Scheduler:
    """Runs cells on Ray GPUs. `order` gives the queue's priority order, `priority_class` the part
    of it planning must keep (recent failures first), `job` what a placed cell's slot runs;
    `measured`, if given, hears each finished outcome as soon as it is back, before the next cells
    are placed (their jobs may use it: a cell's divergence early stop needs its reference's answers)."""

    def __init__(self, cluster: ClusterSpec, durations: Durations, order: Callable[[list[Cell]], list[Cell]],
                 priority_class: Callable[[Cell], Hashable], job: Callable[[Cell, tuple[str, ...]], CellJob],
                 console: Console, quiet: bool, stopping: Callable[[], bool],
                 measured: Callable[[Cell, CellOutcome], None] | None = None,
                 other_starts: Callable[[list[Cell]], list[list[Cell]]] = lambda cells: []) -> None:
        self.cluster = cluster
        self.durations = durations
        self.order = order
        self.other_starts = other_starts  # more orders planning starts from (placement.longest_first)
        self.priority_class = priority_class
        self.job = job
        self.console = console
        self.quiet = quiet
        self.stopping = stopping
        self.measured = measured
        self.expected_end: float | None = None  # the last forecast of when the queue ends

    def run(self, todo: list[Cell], plan: ProtocolPlan, on_outcome: OnOutcome, label: str) -> None:
        """Run `todo` (in priority order) to the end; each outcome goes to `on_outcome`."""
        if not todo:
            return
        plan_ref = ray.put(plan)
        queue, attempts = list(todo), {cell.cell_id: 1 for cell in todo}
        homeless_since: dict[str, float] = {}
        packer = Packer(self.durations, prefer_warm=self.cluster.prefer_warm_nodes)
        pool = SlotPool(packer.inventory, self.cluster.runtime_env or None, self.cluster.slot_resource)
        running: dict[Any, _Running] = {}
        progress = self._progress()
        task = progress.add_task(label, total=len(todo), state="")

        try:
            with progress:
                pool.grow(queue, force=True)
                queue = self._plan(packer, queue, PLAN_TRIES, PLAN_BUDGET_S, PLAN_SHARE, seed=0)
                finished: list[tuple[Cell, CellOutcome, str]] = []
                while queue or running or finished:
                    if self.stopping():
                        raise Interrupted()
                    pool.grow(queue)
                    for placement in packer.place(queue, time.time()):
                        queue.remove(placement.cell)
                        entry = self._start(placement, pool, plan_ref, attempts[placement.cell.cell_id])
                        running[entry.run_ref] = entry
                    for cell, reason in self._homeless(queue, packer, homeless_since):
                        queue.remove(cell)
                        finished.append((cell, _failed(cell, ErrorKind.NO_NODE, reason), ""))
                    if not queue:
                        pool.shrink()  # nothing waits: give idle GPUs back to the cluster
                    for cell, outcome, log in finished:  # after the GPUs went to the next cells
                        progress.advance(task)
                        on_outcome(cell, outcome, log, progress.console)
                    finished = []
                    if not (queue or running):
                        break
                    progress.update(task, state=self._state(queue, running, packer))
                    ready, _ = ray.wait([*running, *pool.refs()], num_returns=1, timeout=0.5)
                    retry, finished = self._take(ready, running, pool)
                    for cell in retry:  # its worker died: retry once, in its place in the queue
                        attempts[cell.cell_id] += 1
                    queue = self.order([*queue, *retry]) if retry else queue
                    if (retry or finished) and queue:  # GPUs came back, durations were learned: the best order may differ
                        queue = self._plan(packer, queue, REPLAN_TRIES, REPLAN_BUDGET_S, REPLAN_SHARE, seed=len(queue))
        finally:
            pool.close()

    def _take(self, ready: list[Any], running: dict[Any, _Running],
              pool: SlotPool) -> tuple[list[Cell], list[tuple[Cell, CellOutcome, str]]]:
        """Handle what `ray.wait` returned: (cells whose worker died, to retry; finished cells)."""
        retry, finished = [], []
        for ref in ready:
            if ref not in running:
                self._slot_event(ref, pool, running)
                continue
            entry = running.pop(ref)
            outcome, log = self._collect(entry, pool)
            if outcome is None:
                retry.append(entry.cell)
            else:
                finished.append((entry.cell, outcome, log))
                if self.measured is not None:
                    self.measured(entry.cell, outcome)
        return retry, finished

    def _progress(self) -> Progress:
        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[state]}"), TimeElapsedColumn(), console=self.console,
                        disable=self.quiet, transient=False)

    def _start(self, placement: Placement, pool: SlotPool, plan_ref: Any, attempt: int) -> _Running:
        """Run a placed cell on its slots; the first slot leads (the server is its child)."""
        slots = pool.assign(placement)
        run_ref = slots[0].actor.run.remote(self.job(placement.cell, placement.gpus), plan_ref)
        return _Running(placement, slots, run_ref, attempt)

    @staticmethod
    def _slot_event(ref: Any, pool: SlotPool, running: dict[Any, _Running]) -> None:
        """A slot was placed or died; a running cell that lost a GPU is stopped (and retried)."""
        lost = pool.handle(ref)
        leader = next((e for e in running.values() if e.cell.cell_id == lost), None)
        if leader is not None:
            with contextlib.suppress(Exception):
                ray.kill(leader.slots[0].actor)

    def _plan(self, packer: Packer, queue: list[Cell], tries: int, budget_s: float, share: float,
              seed: int) -> list[Cell]:
        """The current order, the priority order or another start, whichever the forecast ends
        sooner, improved."""
        starts: list[list[Cell]] = []
        for start in [queue, self.order(queue), *self.other_starts(queue)]:
            if start not in starts:
                starts.append(start)
        typical = self.durations.typical()
        budget_s = min(budget_s, share * typical) if typical is not None else budget_s
        best, expected = improve(packer, starts, time.time(), self.priority_class, tries, seed, budget_s)
        self.expected_end = expected.end if expected is not None else None
        return best

    def _state(self, queue: list[Cell], running: dict[Any, _Running], packer: Packer) -> str:
        busy = sum(len(e.placement.gpus) for e in running.values())
        state = f"queued {len(queue)} · running {len(running)} · GPUs busy {busy}/{busy + len(packer.idle())}"
        if self.expected_end is not None:
            left = max(0.0, self.expected_end - time.time())
            state += f" · expected to end in {left:.0f} s" if left < 90 else f" · expected to end in {left / 60:.0f} min"
        return state

    def _homeless(self, queue: list[Cell], packer: Packer, since: dict[str, float]) -> list[tuple[Cell, str]]:
        """Waiting cells that no node could hold for `cluster.wait_for_nodes_s` (nodes died or
        never joined), with the reason they end in `error`."""
        now = time.monotonic()
        expired = []
        for cell in queue:
            if packer.could_hold(cell):
                since.pop(cell.cell_id, None)
            elif now - since.setdefault(cell.cell_id, now) >= self.cluster.wait_for_nodes_s:
                gpu_type = f", {cell.model.gpu_type}" if cell.model.gpu_type else ""
                expired.append((cell, f"no node of the cluster could hold it ({cell.gpus} GPU(s){gpu_type}) for "
                                      f"{self.cluster.wait_for_nodes_s:.0f} s (cluster.wait_for_nodes_s)"))
        return expired

    def _collect(self, entry: _Running, pool: SlotPool) -> tuple[CellOutcome | None, str]:
        """The cell's outcome, with its GPUs released; None when its worker died and it may be retried."""
        try:
            outcome, log = ray.get(entry.run_ref)
        except RayActorError as error:
            pool.discard(entry.slots[0])
            outcome, log = None, ""
            if entry.attempt > WORKER_RETRIES:
                reason = f"the Ray worker died twice ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
                outcome = _failed(entry.cell, ErrorKind.WORKER_DIED, reason)
        except RayError as error:
            outcome = _failed(entry.cell, ErrorKind.WORKER_FAILED,
                              f"worker failed: {type(error).__name__}: {str(error)[:300]}")
            log = ""
        pool.release(entry.cell.cell_id, entry.slots)
        seconds = held_s(outcome.timings) if outcome is not None else None
        if seconds is not None:
            self.durations.learn(entry.cell, seconds, outcome.stopped_early is not None)
        return outcome, log
