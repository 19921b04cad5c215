"""The GPUs a run holds: one `GpuSlot` actor (`slot_actor`) per GPU, created as the queue needs
them and given back as soon as nothing waits for them.

Ray places each slot (`num_gpus=1`, pinned to a node); the pool tells the inventory which GPU on
which node is idle, learns at once when a slot dies (its `vigil` call fails), replaces it while
its node is alive, and asks Ray for nodes that joined the cluster since the run started.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from harness.run.ray.slot_actor import GpuSlot
from harness.run.scheduling.inventory import Inventory
from harness.run.scheduling.placement import Placement
from harness.suite.matrix import Cell

NODES_REFRESH_S = 5.0


@dataclass
class Slot:
    actor: Any
    node: str
    where_ref: Any
    vigil_ref: Any
    gpu: str | None = None  # known once Ray has placed the slot
    cell: str | None = None  # the cell it leads or holds a GPU for
    number: str = "0"  # the pool's own id on its node (a CPU slot's device id)


def gpu_nodes(resource: str = "GPU") -> list[tuple[str, int, frozenset[str]]]:
    """(node id, slots, accelerator types) of every alive node with slots of `resource` (GPUs, or
    CPU slots), in Ray's order."""
    nodes = []
    for node in ray.nodes():
        resources = node.get("Resources", {})
        gpus = int(resources.get(resource, 0))
        if node.get("Alive") and gpus > 0:
            types = frozenset(key.split(":", 1)[1] for key in resources if key.startswith("accelerator_type:"))
            nodes.append((node["NodeID"], gpus, types))
    return nodes


class SlotPool:
    """Slots of one scheduling pass. `refs()` are what the driver waits on; `handle(ref)` takes
    one that is ready and returns the cell that lost its slot, if any."""

    def __init__(self, inventory: Inventory, runtime_env: dict[str, Any] | None = None,
                 resource: str = "GPU") -> None:
        self.inventory = inventory
        self.runtime_env = runtime_env
        self.resource = resource
        self.slots: dict[Any, Slot] = {}  # where_ref and vigil_ref -> slot
        self.deaths: dict[str, int] = {}
        self.refreshed_at = 0.0

    def refs(self) -> list[Any]:
        return list(self.slots)

    def live(self) -> list[Slot]:
        return list({id(s): s for s in self.slots.values()}.values())

    def slot_for(self, node: str, gpu: str) -> Slot | None:
        return next((s for s in self.live() if s.node == node and s.gpu == gpu), None)

    def assign(self, placement: Placement) -> list[Slot]:
        """The slots of a placed cell's GPUs, marked as its own; the first leads."""
        slots = [self.slot_for(placement.node, gpu) for gpu in placement.gpus]
        assert all(slots), "the packer placed a cell on a GPU without a slot"
        for slot in slots:
            slot.cell = placement.cell.cell_id
        return slots

    def release(self, cell_id: str, slots: list[Slot]) -> None:
        """The cell stopped: its GPUs are idle again, except those whose slot died with it."""
        for slot in slots:
            slot.cell = None
        released = self.inventory.release(cell_id)
        if released is not None:
            node, gpus = released
            for gpu in gpus:
                if self.slot_for(node, gpu) is None:
                    self.inventory.remove_gpu(node, gpu)

    def discard(self, slot: Slot) -> None:
        """The slot's actor is known dead (a call on it failed): stop counting on it."""
        self.deaths[slot.node] = self.deaths.get(slot.node, 0) + 1
        self.refreshed_at = 0.0
        self._forget(slot)

    def grow(self, queue: list[Cell], force: bool = False) -> None:
        """Create slots for what the waiting cells could use at once, on the nodes that fit them;
        asks Ray for its nodes at most every few seconds unless `force`."""
        if not queue or (not force and time.monotonic() - self.refreshed_at < NODES_REFRESH_S):
            return
        self.refreshed_at = time.monotonic()
        slots = self.live()
        spare = sum(1 for s in slots if s.cell is None)
        remaining = sum(cell.gpus for cell in queue) - spare
        nodes = gpu_nodes(self.resource)
        for gone in set(self.inventory.nodes) - {node_id for node_id, _, _ in nodes}:
            self.inventory.remove_node(gone)
        for node_id, declared, types in nodes:
            self.inventory.add_node(node_id, declared, types)
            usable = [c.gpus for c in queue if c.gpus <= declared and (not c.model.gpu_type or c.model.gpu_type in types)]
            if remaining <= 0 or not usable or self.deaths.get(node_id, 0) > declared:
                continue
            have = sum(1 for s in slots if s.node == node_id)
            add = min(declared - have, max(remaining, max(usable) - have))
            for _ in range(max(0, add)):
                self._create(node_id)
            remaining -= max(0, add)

    def shrink(self) -> None:
        """Nothing waits: give every idle slot back to the cluster."""
        for slot in self.live():
            if slot.cell is None:
                self._forget(slot)

    def handle(self, ref: Any) -> str | None:
        """A slot was placed, or died. Returns the cell it was running, when it died doing so."""
        slot = self.slots.get(ref)
        if slot is None:
            return None
        try:
            where = ray.get(ref)
        except RayError:
            # Died, or could not be placed (its node left): its GPU is no longer ours; the next
            # grow() asks Ray for a replacement.
            cell = slot.cell
            self.discard(slot)
            return cell
        if ref is slot.where_ref:
            del self.slots[ref]
            slot.gpu = slot.number if where["gpu"] is None else str(where["gpu"])
            self.inventory.add_gpu(slot.node, slot.gpu)
        return None

    def close(self) -> None:
        for slot in self.live():
            self._forget(slot)

    def _create(self, node_id: str) -> None:
        options: dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        if self.resource != "GPU":
            options |= {"num_gpus": 0, "resources": {self.resource: 1}}
        actor = GpuSlot.options(**options).remote()
        taken = {s.number for s in self.live() if s.node == node_id}
        number = next(str(i) for i in range(len(taken) + 1) if str(i) not in taken)
        slot = Slot(actor, node_id, actor.where.remote(), actor.vigil.remote(), number=number)
        self.slots[slot.where_ref] = self.slots[slot.vigil_ref] = slot
        self.inventory.ask_gpu(node_id, time.time())

    def _forget(self, slot: Slot) -> None:
        """Stop counting on the slot and kill its actor (its server, if any, dies with it)."""
        for ref in (slot.where_ref, slot.vigil_ref):
            self.slots.pop(ref, None)
        if slot.gpu is None:
            self.inventory.unask_gpu(slot.node)
        elif slot.cell is None:
            self.inventory.remove_gpu(slot.node, slot.gpu)
        with contextlib.suppress(Exception):
            ray.kill(slot.actor)
