"""The machines a job's workers run on, as the layout needs them: their cores and the memory
the plan may use. The local backend has one, this machine; the Ray backend one per live node of
the cluster, as Ray reports it (runner/pool/ray.py). Each node is laid out on its own numbers
by runner/plan/layout.py, as a local run on that machine would be; worker ids run on from node to node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from ...workers.helper_messages import GpuMemory
from .layout import Layout, usable_cores
from .memory import MemoryPlan


@dataclass(frozen=True)
class Node:
    node_id: Optional[str]  # Ray's node id; None: this machine, local processes
    ip: str
    cores: tuple[int, ...]  # local: the usable core ids; Ray: positions 0..CPUs-1 (workers/ray_actor.py)
    memory: Optional[int] = None  # bytes the memory plan may use; None: measure (psutil) when settling
    # Its GPUs with their free memory, read before its workers load (runner/pool/gpu_probe.py: this
    # machine's, for a job with GPU layers); none: VRAM is not planned.
    gpus: tuple[GpuMemory, ...] = ()

    def describe(self) -> str:
        return "this machine" if self.node_id is None else f"node {self.ip} ({self.node_id[:12]})"


def local_node() -> Node:
    return Node(None, "", tuple(usable_cores()))


def nodes_from_ray(infos: Sequence[Mapping[str, Any]]) -> list[Node]:
    """Live nodes with CPUs from ray.nodes(): their CPU count (Ray's `CPU` resource: the cores
    it may schedule on; `ray start --num-cpus` sets it) and memory (its `memory` resource: what
    Ray lets tasks and actors use, the object store set apart), head node first, then by IP."""
    nodes = []
    for info in infos:
        res = info.get("Resources", {})
        cpus = int(res.get("CPU", 0))
        if info.get("Alive") and cpus > 0:
            head = "node:__internal_head__" in res
            nodes.append((not head, info.get("NodeManagerAddress", ""),
                          Node(info["NodeID"], info.get("NodeManagerAddress", ""), tuple(range(cpus)),
                               int(res["memory"]) if "memory" in res else None)))
    return [n for _, _, n in sorted(nodes, key=lambda t: (t[0], t[1]))]


@dataclass(frozen=True)
class NodePlan:
    """The workers of each node: node k runs workers first_ids[k] .. first_ids[k] + layouts[k].workers
    - 1. The ids are given when the workers start and kept when the memory plan keeps fewer."""

    nodes: tuple[Node, ...]
    layouts: tuple[Layout, ...]
    first_ids: tuple[int, ...]

    @classmethod
    def of(cls, nodes: Sequence[Node], layouts: Sequence[Layout]) -> "NodePlan":
        firsts = [sum(lay.workers for lay in layouts[:k]) for k in range(len(layouts))]
        return cls(tuple(nodes), tuple(layouts), tuple(firsts))

    def node_of(self) -> dict[int, int]:
        """worker id -> index of its node."""
        return {first + i: k for k, (first, layout) in enumerate(zip(self.first_ids, self.layouts))
                for i in range(layout.workers)}

    def with_flash_attn(self, flash_attn: Sequence[Optional[bool]]) -> "NodePlan":
        """The plan with each node's flash attention as given (decided, or as a resumed job ran it)."""
        return replace(self, layouts=tuple(replace(lay, flash_attn=flash)
                                           for lay, flash in zip(self.layouts, flash_attn)))

    def ran_on_auto(self) -> dict[str, Any]:
        """What a settled plan decided that a rerun must run the same (runner/journal/ran.py): flash
        attention, where every node runs it alike."""
        decided = {lay.flash_attn for lay in self.layouts}
        return {"flash_attn": decided.pop()} if len(decided) == 1 else {}

    def whole(self) -> Layout:
        """One layout for the report and the summary: the first node's, with every node's workers."""
        first = self.layouts[0]
        return replace(first, workers=sum(lay.workers for lay in self.layouts),
                       cores=tuple(c for lay in self.layouts for c in lay.cores),
                       devices=tuple(d for lay in self.layouts for d in lay.devices))


def share(n: int, node: Node, nodes: Sequence[Node]) -> int:
    """A node's share of n questions, by its cores (what the layout sizes its slots for)."""
    total = sum(len(x.cores) for x in nodes)
    return max(1, math.ceil(n * len(node.cores) / total)) if n else 0


def node_report(plan: NodePlan, memory: Sequence[MemoryPlan]) -> list[dict[str, Any]]:
    """Each node's layout and memory plan, for the report."""
    return [{"node_id": node.node_id, "ip": node.ip, "cpus": len(node.cores),
             "memory_mib": round(node.memory / 2**20) if node.memory is not None else None,
             "workers": list(range(first, first + lay.workers)), "threads_per_worker": lay.threads,
             "slots_per_worker": lay.slots, "memory_plan": plan_.as_report()}
            for node, lay, first, plan_ in zip(plan.nodes, plan.layouts, plan.first_ids, memory)]
