"""The low-memory pause: while available memory is under a small share of RAM, no new questions
are admitted; those already decoding finish. Out of memory, the kernel would kill a worker and
its questions would be redone, so waiting is cheaper. Admission resumes once twice the threshold
is available again (the gap keeps it from flapping around one value).

Waiting only helps while something can give memory back: the questions in flight as they
finish, or another process. The workers keep their KV caches when idle, and the memory plan lets
them take up to 90 % of what was available, so on a machine short of memory their own use alone
can be under the threshold. Once no question is in flight, pausing has freed all it can: admission
resumes, saying so, and the memory left then (what the idle run and everything else hold) is the
baseline: the pause comes back only when available memory falls under half of it."""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger("ggbatch")

LOW_MEMORY_FRACTION = 0.05  # of RAM, or of the cgroup's limit where less (runner/plan/cgroup_memory.py)


class Admission(Protocol):
    """What the pause drives (runner/pool/pool.py WorkerPool)."""

    paused: bool
    finished: bool  # every question answered: nothing is left to admit

    @property
    def stopping(self) -> bool: ...

    @property
    def in_flight(self) -> dict[int, int]:
        """worker id -> questions it holds, for each live worker."""

    def pause(self, paused: bool) -> None: ...


class LowMemoryPause:
    def __init__(self, total_memory: int, fraction: float = LOW_MEMORY_FRACTION) -> None:
        self.low = int(total_memory * fraction)
        self.pauses = 0

    def update(self, available: int, pool: Admission) -> None:
        """Called with each memory sample."""
        if pool.stopping:
            return  # admission is over anyway: saying "admitting again" would be wrong
        if not pool.paused:
            if available < self.low:
                log.warning("only %d MiB available: admitting no new questions until memory recovers",
                            available >> 20)
                self.pauses += 1
                pool.pause(True)
        elif available > 2 * self.low:
            log.warning("%d MiB available again: admitting questions", available >> 20)
            pool.pause(False)
        elif _drained(pool):
            self._rebase(available, pool)

    def _rebase(self, available: int, pool: Admission) -> None:
        """Paused with nothing in flight: waiting longer frees nothing the run holds, and would wait
        for good when the run's own workers hold the memory. Admit again; what is available now is
        the baseline the pause is measured against from here on."""
        self.low = available // 2
        log.warning("%d MiB available with no question in flight: pausing has freed all it can (idle "
                    "workers keep their KV caches; the rest is held by them or by other processes). "
                    "Admitting questions again; pausing again under %d MiB. Should a worker be killed "
                    "out of memory, fewer --slots or a smaller --n-ctx make the job fit",
                    available >> 20, self.low >> 20)
        pool.pause(False)


def _drained(pool: Admission) -> bool:
    """Live workers, none holding a question: the questions admitted before the pause have all
    finished. Without a live worker (every one restarting) the pause waits for one to start; a
    finished run has nothing to admit."""
    in_flight = pool.in_flight
    return bool(in_flight) and not any(in_flight.values()) and not pool.finished
