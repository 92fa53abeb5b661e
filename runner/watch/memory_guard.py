"""The low-memory pause: while available memory is under a small share of RAM, no new questions
are admitted; those already decoding finish. Out of memory, the kernel would kill a worker and
its questions would be redone, so waiting is cheaper. Admission resumes once twice the threshold
is available again (the gap keeps it from flapping around one value)."""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger("ggbatch")

LOW_MEMORY_FRACTION = 0.05  # of RAM


class Admission(Protocol):
    """What the pause drives (runner/pool/pool.py WorkerPool)."""

    paused: bool

    @property
    def stopping(self) -> bool: ...

    def pause(self, paused: bool) -> None: ...


class LowMemoryPause:
    def __init__(self, total_memory: int, fraction: float = LOW_MEMORY_FRACTION) -> None:
        self.low = int(total_memory * fraction)
        self.pauses = 0

    def update(self, available: int, pool: Admission) -> None:
        """Called with each memory sample."""
        if pool.stopping:
            return  # admission is over anyway: saying "admitting again" would be wrong
        if available < self.low and not pool.paused:
            log.warning("only %d MiB available: admitting no new questions until memory recovers",
                        available >> 20)
            self.pauses += 1
            pool.pause(True)
        elif available > 2 * self.low and pool.paused:
            log.warning("%d MiB available again: admitting questions", available >> 20)
            pool.pause(False)
