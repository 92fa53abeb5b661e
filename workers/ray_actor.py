"""A worker as a Ray actor (the Ray backend, runner/pool/ray.py): the same life as a worker
process (workers/main.py run_worker: pin, load, serve the engine), run in a thread of the actor,
with a pair of queues where the process has its task queue and results pipe.

    coordinator ── send(seq, msg) ──▶ tasks queue ──▶ run_worker thread ──▶ outbox queue
    coordinator ◀── next_messages(timeout): whatever the outbox holds, and the exit code once the
                    thread has ended

Why polling with two queues, rather than ray.util.queue.Queue: that queue is an actor of its own,
so every message would take two hops and a third process could die; here the only remote calls
are to the worker itself, one outstanding next_messages per worker, which the coordinator waits
on with ray.wait alongside the others. It returns as soon as one message is there, so answers
stream back as they finish; if the actor dies (its node lost, the OOM killer, ray.kill), that
call fails with RayActorError, which is how the coordinator notices the death.

Ray runs a threaded actor's methods in any order, so `send` carries a sequence number and the
actor puts messages on the task queue in the order they were sent (Configure before the first
Chunk, the last Chunk before Stop).

Pinning: Ray's CPU resources are logical and pin nothing. The coordinator gives the worker
positions among its node's usable cores (it plans nodes from the numbers Ray reports, not their
core ids); the actor maps them onto the cores its process may use and pins every thread of the
process to them before llama.cpp loads (threads started later inherit the mask), at the
coordinator's niceness (Ray starts its workers at 15, see pin_process). Ray also sets
OMP_NUM_THREADS to the actor's num_cpus; llama.cpp here runs its threads through OpenMP, so the
variable is set to the worker's own thread count before llama.cpp is imported.

This module imports no Ray: the coordinator wraps the class with ray.remote.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import replace
from typing import Any, Iterable, Optional, Sequence

from .main import run_worker
from .spec import WorkerSpec


def own_cores(positions: Sequence[int], usable: Iterable[int]) -> tuple[int, ...]:
    """The cores of this node that planned positions name: the node's usable cores in order, the
    position wrapping round when Ray counted more CPUs than the process may use."""
    cores = sorted(usable)
    return tuple(sorted({cores[p % len(cores)] for p in positions}))


def pin_process(cores: Sequence[int], niceness: int) -> int:
    """Pin every thread of this process (sched_setaffinity(0) would pin only the caller's), and
    give each the coordinator's niceness (Linux keeps one per thread). Returns the niceness the
    threads have now: Ray starts its workers at niceness 15 (its worker_niceness setting), where
    any other process on the node takes their cores first, and only a privileged process may
    lower it again (else `RAY_worker_niceness=0 ray start ...` does, README)."""
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, cores)
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError:  # a thread that ended meanwhile, or no right to lower the niceness
            pass
    return os.getpriority(os.PRIO_PROCESS, 0)


class _Outbox:
    """The results pipe's one call, onto a queue the coordinator polls."""

    def __init__(self, out: queue.Queue[Any]) -> None:
        self._out = out

    def send_bytes(self, data: bytes) -> None:
        self._out.put(data)


class RayWorker:
    """The actor's body. Methods: send (coordinator -> worker), next_messages (worker ->
    coordinator), where (its pid and cores)."""

    def __init__(self, spec: WorkerSpec, niceness: int = 0) -> None:
        """niceness: the coordinator's (local workers inherit it)."""
        cores = own_cores(spec.cores, os.sched_getaffinity(0))
        self._niceness = pin_process(cores, niceness)
        os.environ["OMP_NUM_THREADS"] = str(len(cores))  # Ray's value is the reservation, not ours to keep
        self._spec = replace(spec, cores=cores, log_path=None)  # stderr stays in Ray's worker log
        self._tasks: queue.Queue[Any] = queue.Queue()
        self._out: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._next_seq = 0
        self._early: dict[int, bytes] = {}
        self._exit: Optional[int] = None
        self._thread = threading.Thread(target=self._life, name="ggbatch-worker", daemon=True)
        self._thread.start()

    def _life(self) -> None:
        ok = run_worker(self._spec, self._tasks, _Outbox(self._out))
        self._exit = 0 if ok else 1
        self._out.put(None)  # after every message: the poll that sees it has all of them

    def send(self, seq: int, data: bytes) -> None:
        with self._lock:
            self._early[seq] = data
            while self._next_seq in self._early:
                self._tasks.put(self._early.pop(self._next_seq))
                self._next_seq += 1

    def next_messages(self, timeout: float) -> tuple[list[bytes], Optional[int]]:
        """The messages waiting (waiting up to `timeout` for the first), and the worker's exit
        code once its life has ended and every message has been taken."""
        out: list[Any] = []
        try:
            out.append(self._out.get(timeout=timeout))
            while True:
                out.append(self._out.get_nowait())
        except queue.Empty:
            pass
        ended = None in out or (self._exit is not None and self._out.empty() and not self._thread.is_alive())
        return [m for m in out if m is not None], (self._exit if ended else None)

    def where(self) -> tuple[int, tuple[int, ...], Optional[str], int]:
        """Its pid, its cores, the OMP_NUM_THREADS llama.cpp will see and its niceness."""
        return os.getpid(), self._spec.cores, os.environ.get("OMP_NUM_THREADS"), self._niceness
