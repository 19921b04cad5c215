"""The GPUs a run holds, node by node: which are idle, which a cell occupies until when, which
slots Ray has not placed yet, and which models each node has loaded (pure bookkeeping: no policy,
no Ray, no clock). The slot pool keeps it current; the packer (`placement`) decides over it; the
forecast plays a copy of it forward.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

SLOT_PATIENCE_S = 60.0


@dataclass
class NodeGpus:
    node_id: str
    rank: int
    declared: int  # GPUs the node has; slots not placed yet count only towards reservations
    types: frozenset[str]
    idle: set[str] = field(default_factory=set)
    asked: list[float] = field(default_factory=list)  # when each slot Ray has not placed yet was asked for
    busy: dict[str, tuple[tuple[str, ...], float]] = field(default_factory=dict)  # cell -> (GPUs, expected end)
    models: set[str] = field(default_factory=set)

    def held(self) -> int:
        return sum(len(gpus) for gpus, _ in self.busy.values())

    def coming(self, now: float) -> int:
        """Slots asked for recently enough to count on soon (Ray places a slot in seconds unless
        something else holds the GPU)."""
        return sum(1 for asked in self.asked if now - asked < SLOT_PATIENCE_S)


class Inventory:
    """Every node the run can place on, by Ray node id."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeGpus] = {}

    def copy(self) -> Inventory:
        """An independent copy."""
        twin = Inventory()
        twin.nodes = copy.deepcopy(self.nodes)
        return twin

    def rehearsal(self, unknown_end: float) -> Inventory:
        """A copy as the forecast plays it forward: every GPU a node declares but has no slot on yet
        counts idle (the pool asks for slots as the queue needs them), and cells started when
        nothing was known are expected to end at `unknown_end`."""
        twin = self.copy()
        for node in twin.nodes.values():
            node.asked.clear()
            for cell_id, (gpus, end) in node.busy.items():
                if math.isinf(end):
                    node.busy[cell_id] = (gpus, unknown_end)
            known = node.idle | {gpu for gpus, _ in node.busy.values() for gpu in gpus}
            spare = (str(number) for number in range(node.declared * 2) if str(number) not in known)
            for _ in range(max(0, node.declared - len(known))):
                node.idle.add(next(spare))
        return twin

    def add_node(self, node_id: str, declared: int, types: frozenset[str] = frozenset()) -> None:
        """A node with `declared` GPUs of `types` (Ray's accelerator types, e.g. "H100")."""
        if node_id not in self.nodes:
            self.nodes[node_id] = NodeGpus(node_id, len(self.nodes), declared, types)

    def ask_gpu(self, node_id: str, now: float) -> None:
        """A slot was asked for on this node; Ray has not placed it yet."""
        self.nodes[node_id].asked.append(now)

    def add_gpu(self, node_id: str, gpu: str) -> None:
        """A slot on this GPU is placed and idle."""
        node = self.nodes[node_id]
        node.idle.add(gpu)
        if node.asked:
            node.asked.pop(0)

    def unask_gpu(self, node_id: str) -> None:
        """A slot asked for on this node will not be placed (it died, or was given back first)."""
        node = self.nodes.get(node_id)
        if node is not None and node.asked:
            node.asked.pop(0)

    def remove_gpu(self, node_id: str, gpu: str) -> None:
        """The GPU's slot is gone (died, or given back to the cluster)."""
        node = self.nodes.get(node_id)
        if node is not None:
            node.idle.discard(gpu)

    def remove_node(self, node_id: str) -> None:
        """The node left the cluster (cells still running there keep it until they are released)."""
        node = self.nodes.get(node_id)
        if node is not None and not node.busy:
            del self.nodes[node_id]

    def eligible(self, gpu_type: str | None) -> list[NodeGpus]:
        """Nodes of the GPU type a model asks for (any node when it asks none)."""
        return [n for n in self.nodes.values() if not gpu_type or gpu_type in n.types]

    def could_hold(self, gpus: int, gpu_type: str | None) -> bool:
        """Some known node is wide enough and of the right type, now or once its slots are placed."""
        return any(max(n.declared, len(n.idle) + n.held()) >= gpus for n in self.eligible(gpu_type))

    def idle(self) -> list[tuple[str, str]]:
        return [(node.node_id, gpu) for node in self.nodes.values() for gpu in node.idle]

    def occupy(self, cell_id: str, node_id: str, gpus: tuple[str, ...], expected_end: float, model_id: str) -> None:
        """A cell runs on these GPUs of the node until about `expected_end`; the node has its model loaded."""
        node = self.nodes[node_id]
        node.idle.difference_update(gpus)
        node.busy[cell_id] = (gpus, expected_end)
        self.loaded(node_id, model_id)

    def loaded(self, node_id: str, model_id: str) -> None:
        """The node has loaded the model in this run: its weights are in the node's page cache."""
        self.nodes[node_id].models.add(model_id)

    def release(self, cell_id: str) -> tuple[str, tuple[str, ...]] | None:
        """A cell stopped: its GPUs are idle again. Returns (node, GPUs) it held."""
        for node in self.nodes.values():
            if cell_id in node.busy:
                gpus, _ = node.busy.pop(cell_id)
                node.idle.update(gpus)
                return node.node_id, gpus
        return None
