"""psutil sampling of the workers and the machine, about once a second (from the pool's tick).

PSS, not RSS: llama.cpp mmaps the model file, and those pages are shared between workers, so
summed RSS would count them once per worker.

Each sample also keeps what every core did since the one before (busy, steal) and each worker's
CPU time in that interval: runner/watch/thread_controller.py tells from them how much of a worker's cores other
processes took."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import psutil

from ..plan.cgroup_memory import system_memory


@dataclass
class WorkerUsage:
    cpu_s: float = 0.0  # user + system CPU time at the last sample
    alive_s: float = 0.0  # wall time since the process started, at the last sample
    peak_pss: int = 0
    peak_uss: int = 0
    peak_rss: int = 0
    affinity: tuple[int, ...] = ()  # read from outside: the cores the process may run on
    state: str = ""  # psutil's status at the last sample: "running", "sleeping", "stopped", ...
    peak_threads: int = 0
    samples: int = 0
    pid: int = 0  # of the life sampled last
    earlier_cpu_s: float = 0.0  # CPU time of its earlier lives (restarts)
    earlier_alive_s: float = 0.0  # and their wall time, as last sampled
    pss: int = 0  # as last measured
    threads: int = 0  # as last sampled
    interval_cpu_s: Optional[float] = None  # CPU time since the sample before (None: first of this life)

    @property
    def total_cpu_s(self) -> float:
        """CPU time over all its lives."""
        return self.earlier_cpu_s + self.cpu_s

    @property
    def mean_cpu(self) -> float:
        """Mean CPU% over all its lives so far (100 = one core busy all the time), as the report's
        questions count them: the last life's alone read near 0 % after a restart late in a run."""
        alive_s = self.earlier_alive_s + self.alive_s
        return 100.0 * self.total_cpu_s / alive_s if alive_s > 0 else 0.0


class Monitor:
    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}  # pid -> Process
        self.workers: dict[int, WorkerUsage] = {}
        # each core's busy % summed over the samples, and how many: the means in O(cores), however long it runs
        self._core_sums: list[float] = []
        self._core_counts: list[int] = []
        self.cores: list[CoreTime] = []  # each core over the last interval, indexed by CPU number
        memory = system_memory()  # the host's, or its cgroup's where that is less
        self.min_available = memory.available
        self.limit = memory.limit  # the cgroup's, as last read
        self.peak_used = 0
        self._cpu_times = psutil.cpu_times(percpu=True)  # per core, at the last sample

    PSS_EVERY = 5  # samples: PSS walks the page tables, RSS and CPU are cheap

    def sample(self, pids: Mapping[int, int], final: bool = False) -> int:
        """pids: worker id -> pid of its live process. Returns the available memory (the host's, or
        its cgroup's room where that is less: runner/plan/cgroup_memory.py)."""
        for worker_id, pid in pids.items():
            usage = self.workers.setdefault(worker_id, WorkerUsage())
            try:
                proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                first = pid != usage.pid  # of this life (a restart's CPU time starts again at 0)
                if first:
                    usage.earlier_cpu_s, usage.cpu_s, usage.pid = usage.total_cpu_s, 0.0, pid
                    usage.earlier_alive_s, usage.alive_s = usage.earlier_alive_s + usage.alive_s, 0.0
                self._sample_one(proc, usage, final, first)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        # only the live processes' handles: a warm pool restarting workers for days keeps no more
        live = set(pids.values())
        self._procs = {pid: proc for pid, proc in self._procs.items() if pid in live}
        for worker_id, usage in self.workers.items():
            if worker_id not in pids:  # between lives, or given up: it holds no memory, runs no thread
                usage.pss, usage.threads = 0, 0
        memory = system_memory()
        self.min_available = min(self.min_available, memory.available)
        self.peak_used = max(self.peak_used, memory.total - memory.available)
        self.limit = memory.limit
        times = psutil.cpu_times(percpu=True)
        self.cores = core_times(self._cpu_times, times)
        self._cpu_times = times
        self._add_cores()
        return memory.available

    def _add_cores(self) -> None:
        for i, core in enumerate(self.cores):
            if i == len(self._core_sums):
                self._core_sums.append(0.0)
                self._core_counts.append(0)
            self._core_sums[i] += core.percent
            self._core_counts[i] += 1

    def _sample_one(self, proc: psutil.Process, usage: WorkerUsage, final: bool, first: bool) -> None:
        with proc.oneshot():
            times = proc.cpu_times()
            cpu_s = times.user + times.system
            usage.interval_cpu_s = None if first else max(0.0, cpu_s - usage.cpu_s)
            usage.cpu_s = cpu_s
            usage.alive_s = time.time() - proc.create_time()
            usage.state = proc.status()
            usage.affinity = tuple(proc.cpu_affinity())
            usage.threads = proc.num_threads()
            usage.peak_threads = max(usage.peak_threads, usage.threads)
            # Every core runs a llama.cpp thread, so the monitor's own CPU is taken
            # from them: the page-table walk for PSS/USS runs on every 5th sample only.
            if usage.samples % self.PSS_EVERY == 0 or final:
                full = proc.memory_full_info()
                usage.pss = full.pss
                usage.peak_pss = max(usage.peak_pss, full.pss)
                usage.peak_uss = max(usage.peak_uss, full.uss)
            usage.peak_rss = max(usage.peak_rss, proc.memory_info().rss)
            usage.samples += 1

    def summary(self) -> "UsageSummary":
        cores = [round(total / n, 1) for total, n in zip(self._core_sums, self._core_counts)]
        return UsageSummary(
            {wid: {"mean_cpu_percent": round(u.mean_cpu, 1), "peak_pss_mib": round(u.peak_pss / 2**20, 1),
                   "peak_uss_mib": round(u.peak_uss / 2**20, 1), "peak_rss_mib": round(u.peak_rss / 2**20, 1),
                   "affinity": list(u.affinity), "peak_os_threads": u.peak_threads}
             for wid, u in sorted(self.workers.items())},
            cores, round(self.peak_used / 2**20, 1), round(self.min_available / 2**20, 1),
            round(self.limit / 2**20, 1) if self.limit is not None else None)


@dataclass(frozen=True)
class CoreTime:
    """One core over one monitor interval, in seconds."""

    total_s: float
    busy_s: float  # all but idle and iowait: processes, interrupts, and steal (another machine ran)
    steal_s: float

    @property
    def percent(self) -> float:
        return 100.0 * self.busy_s / self.total_s if self.total_s > 0 else 0.0


def core_times(before: Sequence[Any], after: Sequence[Any]) -> list[CoreTime]:
    """Each core's time between two psutil.cpu_times(percpu=True) readings, as psutil's
    cpu_percent counts it: guest time is inside user time already, so it is not added again."""
    out = []
    for b, a in zip(before, after):
        d = {f: max(0.0, getattr(a, f) - getattr(b, f)) for f in a._fields}
        total = sum(d.values()) - d.get("guest", 0.0) - d.get("guest_nice", 0.0)
        idle = d.get("idle", 0.0) + d.get("iowait", 0.0)
        out.append(CoreTime(total, max(0.0, total - idle), d.get("steal", 0.0)))
    return out


@dataclass(frozen=True)
class UsageSummary:
    """What the monitor measured over the run, as the report shows it."""

    workers: dict[int, dict[str, Any]]  # worker id -> CPU, memory and thread figures
    mean_core_utilisation_percent: list[float] = field(default_factory=list)
    peak_system_used_mib: float = 0.0
    min_system_available_mib: float = 0.0
    cgroup_limit_mib: Optional[float] = None  # the cgroup's memory limit, when one held the run
