"""When the queue is expected to finish, and a queue order that finishes sooner, found by trying.

The packer is greedy: it starts the queue in order wherever it fits. Which order packs best
depends on the durations (two tp-8 cells of 10 minutes, then eight tp-1 cells of 20, pack
differently than the other way round), and no fixed rule gets it right for every matrix. Once
durations are known (every nightly after the first, and each model once one of its cells has
finished), the driver can instead play the packer forward on the expected durations (`forecast`)
and keep whichever order ends soonest (`improve`): a hill climb that moves one cell at a time,
within its priority class (recent failures stay first) and never ahead of its reference cell, and
keeps a move that ends no later and starts the GPU-seconds no later on average. The same forecast
tells the user when the run should end.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from harness.run.scheduling.placement import Packer
from harness.suite.matrix import Cell


@dataclass(frozen=True, order=True)
class Forecast:
    end: float  # when the last cell is expected to end
    mean_end: float  # the queue's mean end, weighted by GPUs: starting wide work early breaks ties


def forecast(packer: Packer, queue: list[Cell], now: float) -> Forecast | None:
    """Play the packer forward on expected durations, every GPU the nodes declare available now.
    None when some queued cell has no expected duration (measured on the benchmark's first runs,
    planning on guesses ended later than the priority order alone), or would never start."""
    if any(packer.durations.expect(cell) is None for cell in queue):
        return None
    ahead = _rehearsal(packer, now)
    ends = [(max(end, now), cell_id) for node in ahead.nodes.values() for cell_id, (_, end) in node.busy.items()]
    heapq.heapify(ends)
    waiting, clock, last, weighted, gpus = list(queue), now, now, 0.0, 0
    while waiting:
        for placement in ahead.place(waiting, clock):
            waiting.remove(placement.cell)
            _, end = ahead.nodes[placement.node].busy[placement.cell.cell_id]
            heapq.heappush(ends, (end, placement.cell.cell_id))
            weighted += placement.cell.gpus * (end - now)
            gpus += placement.cell.gpus
            last = max(last, end)
        if not waiting:
            break
        if not ends:
            return None
        clock, cell_id = heapq.heappop(ends)
        ahead.release(cell_id)
        while ends and ends[0][0] <= clock:
            ahead.release(heapq.heappop(ends)[1])
    last = max([last, *(end for end, _ in ends)])
    return Forecast(end=last, mean_end=weighted / gpus if gpus else 0.0)


def improve(packer: Packer, starts: list[list[Cell]], now: float, priority_class: Callable[[Cell], Hashable],
            tries: int, seed: int = 0, budget_s: float = math.inf) -> tuple[list[Cell], Forecast | None]:
    """The best of `starts` (each the same cells, in priority-class order), then moved one cell
    at a time within its class, never ahead of its reference, while the forecast does not get
    worse; at most `tries` moves or `budget_s` seconds."""
    scored = [(forecast(packer, start, now), index) for index, start in enumerate(starts)]
    known = [(score, index) for score, index in scored if score is not None]
    if not known:
        return starts[0], None
    best, index = min(known)
    order = list(starts[index])
    classes = [priority_class(cell) for cell in order]
    spans = [(first, last) for first, last in _runs(classes) if last - first > 1]
    if not spans:
        return order, best
    rng = random.Random(seed)
    deadline = time.monotonic() + budget_s
    weights = [last - first for first, last in spans]
    for _ in range(tries):
        if time.monotonic() > deadline:
            break
        first, last = rng.choices(spans, weights)[0]
        source, target = rng.randrange(first, last), rng.randrange(first, last)
        if source == target:
            continue
        candidate = list(order)
        candidate.insert(target, candidate.pop(source))
        if not _references_lead(candidate):
            continue
        score = forecast(packer, candidate, now)
        if score is not None and score <= best:
            order, best = candidate, score
    return order, best


def _references_lead(order: list[Cell]) -> bool:
    """Every queued reference comes before the cells compared with it."""
    queued = {cell.cell_id for cell in order}
    seen: set[str] = set()
    for cell in order:
        if cell.reference_cell in queued and cell.reference_cell not in seen:
            return False
        seen.add(cell.cell_id)
    return True


def _runs(classes: list[Hashable]) -> list[tuple[int, int]]:
    """[first, last) index ranges of equal consecutive classes."""
    runs, first = [], 0
    for index in range(1, len(classes) + 1):
        if index == len(classes) or classes[index] != classes[first]:
            runs.append((first, index))
            first = index
    return runs


def _rehearsal(packer: Packer, now: float) -> Packer:
    """A copy of the packer to play forward (see `Inventory.rehearsal`)."""
    inventory = packer.inventory.rehearsal(now + (packer.durations.typical() or 0.0))
    return Packer(packer.durations, prefer_warm=packer.prefer_warm, inventory=inventory)
