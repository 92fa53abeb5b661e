"""The load on a worker's cores while it loaded its model: the thread controller's first evidence.

A worker loads its model for a second or more before its first step, and that first step carries
the prompts: the longest steps of a run, and beside busy processes the slowest at the layout's
thread count (docs/guide/sharing.md). Measured per monitor tick, contention is seen 2 s
after the run starts, by when that step is under way at the old count and has to be waited out.
Measured from the job's start to the worker's Ready, it is seen before the step, and
runner/watch/thread_controller.py decides on it with the same rule it applies afterwards.

    job start: every core's times, ggbatch's CPU time ──▶ SinceStart
    worker Ready: the cores' busy time since, less ggbatch's own ──▶ CoreLoad ──▶ ThreadController

Everything ggbatch runs is its own load, not other load: the worker (pinned to its cores) and
the coordinator with its helpers (the tokenizer process, the journal index thread), which run
wherever the kernel puts them, so their CPU time is counted on the worker's cores in proportion
to how many of the coordinator's cores those are. (In a program that runs ggbatch through its
Python API, that program's other children count as ggbatch's: they can hide other load from the
controller, never make it up.)
"""

from __future__ import annotations

import os
from typing import Collection, Optional, Sequence

import psutil

from .monitor import core_times
from .thread_controller import CoreLoad, core_load


def ggbatch_cpu_s() -> float:
    """CPU seconds of this process, of its children it has waited for, and of its live
    descendants (workers, the tokenizer process), with what they waited for in turn."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for proc in psutil.Process().children(recursive=True):
        try:
            total += sum(proc.cpu_times()[:4])  # user, system, children_user, children_system
        except psutil.Error:  # ended meanwhile: waited for, it is in children_* above
            continue
    return total


def process_cpu_s(pid: int) -> Optional[float]:
    """A process's CPU seconds (user + system); None once it is gone."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


def own_share(worker_cpu_s: float, coordinator_cpu_s: float, affinity: Sequence[int],
              coordinator_cores: int) -> float:
    """A worker's own CPU time on its cores: all of the worker's, and the part of the
    coordinator's (and its helpers') that fell on those cores if it spread evenly over its own."""
    share = min(1.0, len(affinity) / coordinator_cores) if coordinator_cores else 1.0
    return worker_cpu_s + max(0.0, coordinator_cpu_s) * share


class SinceStart:
    """Every core's times and ggbatch's CPU time at the job's start (before any worker exists),
    to measure the load on a worker's cores from then until it is ready."""

    def __init__(self) -> None:
        self._cores = psutil.cpu_times(percpu=True)
        self._ours_s = ggbatch_cpu_s()

    def load(self, pid: int, affinity: Sequence[int], worker_pids: Collection[int]) -> Optional[CoreLoad]:
        """The worker `pid`'s cores from the start to now, its own CPU time (and its share of the
        coordinator's) taken out; worker_pids: every live worker on this machine, whose CPU time is
        not the coordinator's. None when a worker's process cannot be read."""
        cores = core_times(self._cores, psutil.cpu_times(percpu=True))
        ours = ggbatch_cpu_s() - self._ours_s
        readings = {p: process_cpu_s(p) for p in {pid, *worker_pids}}
        workers = {p: cpu for p, cpu in readings.items() if cpu is not None}
        if len(workers) < len(readings):  # a worker ended meanwhile: its CPU time is unknown
            return None
        coordinator = ours - sum(workers.values())
        return core_load(cores, affinity, own_share(workers[pid], coordinator, affinity,
                                                    len(os.sched_getaffinity(0))))
