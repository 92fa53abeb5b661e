"""What a worker's start (its Ready) shows that the run should hear, each said once a run
(runner/pool/pool.py tells it of each Ready): what recurrent or hybrid memory changes; a Ray node
that counts more CPUs than its processes may use."""

from __future__ import annotations

import logging
from typing import Sequence

from ...workers.engine.memory_kind import MemoryKind
from ...workers.protocol import Ready
from .worker_state import WorkerState, on_node

log = logging.getLogger("ggbatch")


class StartNotes:
    def __init__(self) -> None:
        self.memory_noted = False  # what recurrent or hybrid memory changes
        self.cores_noted = False  # a Ray node counting more CPUs than it has

    def say(self, w: WorkerState, msg: Ready, workers: Sequence[WorkerState]) -> None:
        """What worker w's start shows, once: what recurrent or hybrid memory changes; a Ray node
        that counts more CPUs than its processes may use (`ray start --num-cpus` above its
        cores), where workers planned on cores apart share the same ones."""
        note = MemoryKind(msg.memory).note()
        if note and not self.memory_noted:
            log.info("%s", note)
            self.memory_noted = True
        if w.spec.node_id is None or self.cores_noted:
            return
        taken = {c for other in workers if other is not w and other.ready is not None
                 and other.spec.node_id == w.spec.node_id for c in other.ready.cores}
        shared = taken & set(msg.cores)
        if len(msg.cores) < len(w.spec.cores) or shared:
            log.warning("worker %d%s: planned on %d cores of its own, it runs on %s%s: Ray counts more CPUs on that "
                        "node than its processes may use (ray start --num-cpus above its cores?)", msg.worker_id,
                        on_node(w.spec), len(w.spec.cores), ",".join(map(str, msg.cores)),
                        " with other workers" if shared else "")
            self.cores_noted = True
