"""Which waiting cell runs next, on which node and which GPUs (pure: no Ray, no clock).

The driver holds every GPU it schedules on through one slot actor per GPU (see `slots`), so it
knows which GPUs are idle on which node and places cells itself instead of leaving the order to
Ray, which starts pending actors in no particular order and lets narrow cells fragment the node
a tp-8 cell is waiting for. The policy:

- the queue is in priority order (`priority_order`): recent failures, then the widest first, each
  reference ahead of the cells compared with it; once durations are known the scheduler reorders
  it, within those rules, to the order expected to end soonest (`forecast`);
- a cell that fits goes to the node it fills best (fewest GPUs left idle), then to a node that
  has already loaded its model (the weights are in that node's page cache), then the first node;
- the first cell that fits nowhere reserves the node where it will fit soonest, judged by the
  expected ends of the cells running there (slots Ray is still starting count as idle: they come
  in seconds, unless something else holds those GPUs for longer than SLOT_PATIENCE_S); a later
  cell may use that node only if it is expected to end before then, or if it fits in GPUs the
  reserved cell will not need (EASY backfilling); with no duration known at all (the first cells
  of a new suite) nothing backfills. Later cells reserve only nodes whose slots are still
  starting, so that the narrow cells further down the queue do not take each slot as it comes up
  at the start of a run; one reservation per node at all times (conservative backfilling) was
  measured too, and left more GPUs idle while the next width phase gathered;
- within a node a tp-k cell takes an aligned block of k GPUs when one is idle (0-3, 4-7, ...),
  which keeps blocks whole for the next wide cell and matches how GPUs share switches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.run.scheduling.durations import Durations
from harness.run.scheduling.inventory import Inventory, NodeGpus
from harness.suite.matrix import Cell


@dataclass(frozen=True)
class Placement:
    cell: Cell
    node: str
    gpus: tuple[str, ...]


@dataclass
class _Reservation:
    node: NodeGpus
    shadow: float  # when the reserved cell is expected to fit (inf: unknown)
    extra: int  # GPUs idle at that time that the reserved cell will not need


def priority_order(cells: list[Cell], durations: Durations, first: set[str]) -> list[Cell]:
    """Cells in `first` (recent failures and their references: a PR learns its verdict sooner)
    before the rest; then the widest first, and within a width the model with the longest cells
    first, each model's reference ahead of the cells compared with it, then its longest expected.
    Widths run as phases, so a freed block suits the next cell as it is instead of idling while a
    wider cell gathers its GPUs; the narrowest cells fill the end. A reference starts no later than
    any cell compared with it (they have the same width), so every paired test has its reference."""
    typical = durations.typical() or 1.0
    longest: dict[str, float] = {}
    for cell in cells:
        longest[cell.model.id] = max(longest.get(cell.model.id, 0.0), durations.expect(cell) or typical)

    def key(cell: Cell) -> tuple[int, int, float, str, bool, float, str]:
        return (priority_class(cell, first), -cell.gpus, -longest[cell.model.id], cell.model.id,
                not cell.is_reference, -(durations.expect(cell) or typical), cell.cell_id)

    return sorted(cells, key=key)


def longest_first(cells: list[Cell], durations: Durations, first: set[str]) -> list[Cell]:
    """Cells in `first` before the rest, then the longest expected first whatever their width, each
    reference moved just ahead of the first cell compared with it. Another start for planning
    (`forecast.improve` keeps whichever start ends soonest): on matrices whose longest cells are
    narrow, the width phases of `priority_order` start them last, and the run ends on them alone."""
    typical = durations.typical() or 1.0
    ranked = sorted(cells, key=lambda cell: (priority_class(cell, first), -(durations.expect(cell) or typical),
                                             cell.cell_id))
    queued = {cell.cell_id: cell for cell in ranked}
    order: list[Cell] = []
    placed: set[str] = set()
    for cell in ranked:
        reference = queued.get(cell.reference_cell or "")
        if reference is not None and reference.cell_id not in placed:
            order.append(reference)
            placed.add(reference.cell_id)
        if cell.cell_id not in placed:
            order.append(cell)
            placed.add(cell.cell_id)
    return order


def priority_class(cell: Cell, first: set[str]) -> int:
    """The part of the priority order that planning keeps: 0 for the cells in `first`, 1 for the rest."""
    return 0 if cell.cell_id in first else 1


def pick_gpus(idle: set[str], count: int) -> tuple[str, ...]:
    """`count` of the idle GPU ids: an aligned block (0-3, 4-7; 0-1, 2-3, ...) when one is idle."""
    ordered = sorted(idle, key=lambda gpu: (not gpu.isdigit(), int(gpu) if gpu.isdigit() else 0, gpu))
    numbers = {int(gpu) for gpu in idle if gpu.isdigit()}
    if count > 0 and count & (count - 1) == 0:  # a power of two: look for an aligned block
        for start in range(0, max(numbers, default=-1) + 1, count):
            if all(start + offset in numbers for offset in range(count)):
                return tuple(str(start + offset) for offset in range(count))
    return tuple(ordered[:count])


class Packer:
    """The placement policy over the GPUs an `Inventory` says the run holds."""

    def __init__(self, durations: Durations, prefer_warm: bool = True, inventory: Inventory | None = None) -> None:
        self.durations = durations
        self.prefer_warm = prefer_warm
        self.inventory = inventory if inventory is not None else Inventory()

    @property
    def nodes(self) -> dict[str, NodeGpus]:
        return self.inventory.nodes

    def could_hold(self, cell: Cell) -> bool:
        """Some known node is wide enough and of the right type, now or once its slots are placed."""
        return self.inventory.could_hold(cell.gpus, cell.model.gpu_type)

    def idle(self) -> list[tuple[str, str]]:
        return self.inventory.idle()

    def release(self, cell_id: str) -> tuple[str, tuple[str, ...]] | None:
        """A cell stopped: its GPUs are idle again. Returns (node, GPUs) it held."""
        return self.inventory.release(cell_id)

    # ---- placing ---------------------------------------------------------------------------------------
    def place(self, queue: list[Cell], now: float) -> list[Placement]:
        """Start what can start now, in queue order; each placement is marked busy at once."""
        placements: list[Placement] = []
        reserved: dict[str, _Reservation] = {}
        most_idle = max((len(n.idle) for n in self.nodes.values()), default=0)
        starting = any(n.coming(now) for n in self.nodes.values())
        for cell in queue:
            if most_idle == 0:
                break
            if reserved and cell.gpus > most_idle and not starting:
                continue  # fits nowhere, and with no slot starting it may not reserve either
            eligible = self._eligible(cell)
            fitting = [n for n in eligible if len(n.idle) >= cell.gpus
                       and self._may_use(cell, now, reserved.get(n.node_id))]
            if fitting:
                node = min(fitting, key=lambda n: (len(n.idle) - cell.gpus,
                                                   self.prefer_warm and cell.model.id not in n.models, n.rank))
                reservation = reserved.get(node.node_id)
                if reservation is not None and not self._ends_before(cell, now, reservation):
                    reservation.extra -= cell.gpus
                placements.append(self._start(cell, node, now))
                most_idle = max(len(n.idle) for n in self.nodes.values())
                continue
            # The first cell that fits nowhere reserves a node; a later one only a node whose slots
            # are merely still starting (see the module's docstring).
            reservation = self._reserve([n for n in eligible if n.node_id not in reserved], cell, now)
            if reservation is not None and (not reserved or reservation.shadow <= now):
                reserved[reservation.node.node_id] = reservation
        return placements

    def _eligible(self, cell: Cell) -> list[NodeGpus]:
        return self.inventory.eligible(cell.model.gpu_type)

    def _guess(self, cell: Cell) -> float | None:
        # A cell nothing is known of counts as typical once anything is: a wrong guess delays a
        # reserved cell by at most one cell, while no guess would leave the GPUs idle.
        return self.durations.expect(cell) or self.durations.typical()

    def _expected_end(self, cell: Cell, now: float) -> float:
        expected = self._guess(cell)
        return now + expected if expected is not None else math.inf

    def _ends_before(self, cell: Cell, now: float, reservation: _Reservation) -> bool:
        expected = self._guess(cell)
        return expected is not None and now + expected <= reservation.shadow

    def _may_use(self, cell: Cell, now: float, reservation: _Reservation | None) -> bool:
        if reservation is None:
            return True
        return self._ends_before(cell, now, reservation) or cell.gpus <= reservation.extra

    def _start(self, cell: Cell, node: NodeGpus, now: float) -> Placement:
        gpus = pick_gpus(node.idle, cell.gpus)
        self.inventory.occupy(cell.cell_id, node.node_id, gpus, self._expected_end(cell, now), cell.model.id)
        return Placement(cell, node.node_id, gpus)

    def _reserve(self, eligible: list[NodeGpus], cell: Cell, now: float) -> _Reservation | None:
        """The node where `cell` fits soonest, with what will be left over there."""
        best: tuple[tuple[float, int, int], _Reservation] | None = None
        for node in eligible:
            if max(node.declared, len(node.idle) + node.held()) < cell.gpus:
                continue
            available, shadow = len(node.idle) + node.coming(now), now
            for gpus, end in sorted(node.busy.values(), key=lambda item: item[1]):
                if available >= cell.gpus:
                    break
                available, shadow = available + len(gpus), max(shadow, end)
            if available < cell.gpus:  # slots not asked for yet, or long overdue: when is unknown
                available, shadow = max(node.declared, available), math.inf
            key = (shadow, -len(node.idle), node.rank)
            if best is None or key < best[0]:
                best = (key, _Reservation(node, shadow, available - cell.gpus))
        return best[1] if best else None
