"""Fair under contention: how many llama.cpp threads each worker should run while other processes
take its cores. Pure: fed one sample per worker per monitor tick, it returns the changes to make
and why.

Why change them: llama.cpp's threads meet at a barrier for every graph node, so when another
process takes one of a worker's cores, every thread waits for the descheduled one (and OpenMP's
barrier spins meanwhile). Beside one busy loop on 2 cores, 2 threads ran W1 2.4× slower than on a
quiet machine and 1 thread 1.8× slower (docs/performance/sharing.md): fewer threads, each with a
core to itself, beat more threads taking turns.

The signal is the other load on the worker's cores: the cores' busy time (everything but idle
and iowait, CPU steal included) minus the worker's own CPU time, over the interval. A worker runs
only on its cores (it is pinned), so what is left is what other processes, and the hypervisor
(steal), took from them, whatever the worker was doing meanwhile (decoding, sampling, waiting for
questions). The worker's own CPU share is no signal by itself: it also falls when the worker waits
for work.

    wanted = floor(cores - other load + tolerance), never below 1 nor above the layout's threads

Lowering tolerates LOWER_TOLERANCE of a core of other load per thread given up, raising wants
the other load RAISE_TOLERANCE under the count it raises to; and the evidence must last:
LOWER_AFTER_S of intervals all wanting fewer threads, RAISE_AFTER_S all wanting more. Other load
looks smaller to a worker running more threads (they take part of the time it wants), and larger
to one running fewer, which widens the gap between the two thresholds: the count cannot flap.

A worker's first interval runs from the job's start to its Ready (runner/watch/startup_load.py): the
seconds it spends loading are evidence too, READY_LOWER_AFTER_S of it enough, so beside busy
processes its first step, the prompts, already runs fewer threads instead of being waited out at
the layout's count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..words import counted
from .monitor import CoreTime

LOWER_AFTER_S = 2.0  # seconds of contention before a thread is given up
# ... or, at a worker's Ready, of one interval reaching back to the job's start. Before the first
# step there is no count to flap and the most to gain: that step carries the prompts, the longest
# of a run, and a model whose pages are cached loads in about 1.3 s (28 × 1024, Q4_K_M, here).
READY_LOWER_AFTER_S = 1.0
RAISE_AFTER_S = 5.0  # seconds of free cores before one is taken back
LOWER_TOLERANCE = 0.4  # cores of other load tolerated before giving up a thread
RAISE_TOLERANCE = 0.25  # cores of other load still allowing a thread back
# A worker using less than this share of a core did no work in the interval (it waited for
# questions): other load then, often a warm pool's caller preparing the next call, slowed nothing,
# and a thread given up for it would cost the next step (the prompts, seconds long) at half speed.
# Its contention is judged once it works: LOWER_AFTER_S later, or at Ready before its first step.
IDLE_OWN = 0.1
MIN_INTERVAL_S = 0.25  # shorter intervals (a final sample right after a tick) say too little
SLACK_S = 0.1  # ticks come about every second, a little early or late


@dataclass(frozen=True)
class CoreLoad:
    """One worker's cores over one monitor interval, in seconds (per-CPU times from /proc/stat)."""

    interval_s: float  # the interval's length (its cores' mean total time)
    cores: int  # the cores the worker is pinned to
    busy_s: float  # CPU time those cores were busy, summed (steal included)
    steal_s: float  # of which the hypervisor ran other machines
    own_s: float  # the worker's own CPU time (all its threads)

    @property
    def other(self) -> float:
        """Cores' worth of load on the worker's cores that was not the worker's."""
        return max(0.0, self.busy_s - self.own_s) / self.interval_s if self.interval_s > 0 else 0.0

    @property
    def steal(self) -> float:
        return self.steal_s / self.interval_s if self.interval_s > 0 else 0.0


def core_load(cores: Sequence[CoreTime], affinity: Sequence[int], own_s: Optional[float]) -> Optional[CoreLoad]:
    """A worker's cores (`affinity`, CPU numbers) over the monitor's last interval, with its own
    CPU time in it; None when there is no interval yet (a worker's first sample) or a core
    psutil did not list."""
    if own_s is None or not affinity or any(c >= len(cores) for c in affinity):
        return None
    mine = [cores[c] for c in affinity]
    return CoreLoad(sum(c.total_s for c in mine) / len(mine), len(mine), sum(c.busy_s for c in mine),
                    sum(c.steal_s for c in mine), own_s)


def wanted_threads(load: CoreLoad, ceiling: int, tolerance: float) -> int:
    """The threads that fit in what the other load leaves of the worker's cores."""
    return max(1, min(ceiling, math.floor(load.cores - load.other + tolerance)))


@dataclass(frozen=True)
class ThreadChange:
    """A decision: run `to` llama.cpp threads instead of `threads`, because `reason`."""

    worker_id: int
    threads: int
    to: int
    reason: str


@dataclass
class _Evidence:
    """The current run of intervals agreeing on a change, in one direction."""

    since: float  # start of its first interval
    to: int  # the most conservative count wanted so far (nearest the current one)
    other_s: float = 0.0  # other load × interval, summed: its mean for the reason
    steal_s: float = 0.0

    def add(self, load: CoreLoad, wanted: int, lowering: bool) -> None:
        self.to = max(self.to, wanted) if lowering else min(self.to, wanted)
        self.other_s += load.other * load.interval_s
        self.steal_s += load.steal * load.interval_s


@dataclass
class _Track:
    threads: int  # the count at the last sample; another one means the worker changed (restart)
    lower: Optional[_Evidence] = None
    higher: Optional[_Evidence] = None


@dataclass
class ThreadController:
    lower_after_s: float = LOWER_AFTER_S
    raise_after_s: float = RAISE_AFTER_S
    tracks: dict[int, _Track] = field(default_factory=dict)

    def sample(self, worker_id: int, now: float, load: CoreLoad, threads: int, ceiling: int,
               at_ready: bool = False) -> Optional[ThreadChange]:
        """One interval of one worker that runs `threads` llama.cpp threads (at most `ceiling`,
        the layout's), ending at `now`; returns a change once its evidence has lasted. at_ready:
        the interval from the job's start to the worker's Ready, before its first step."""
        track = self.tracks.get(worker_id)
        if track is None or track.threads != threads:
            track = self.tracks[worker_id] = _Track(threads)
        if load.interval_s < MIN_INTERVAL_S or load.cores < 1:
            return None
        fewer = wanted_threads(load, ceiling, LOWER_TOLERANCE)
        more = wanted_threads(load, ceiling, RAISE_TOLERANCE)
        if fewer < threads:
            track.higher = None
            if load.own_s < IDLE_OWN * load.interval_s and not at_ready:
                track.lower = None  # idle, it lost nothing to the other load: no evidence yet
                return None
            track.lower = _grow(track.lower, now, load, fewer, lowering=True)
            after_s = min(self.lower_after_s, READY_LOWER_AFTER_S) if at_ready else self.lower_after_s
            return self._decide(worker_id, track, track.lower, after_s, now, load.cores)
        if more > threads:
            track.lower = None
            track.higher = _grow(track.higher, now, load, more, lowering=False)
            return self._decide(worker_id, track, track.higher, self.raise_after_s, now, load.cores)
        track.lower = track.higher = None
        return None

    def forget(self, worker_id: int) -> None:
        self.tracks.pop(worker_id, None)

    def _decide(self, worker_id: int, track: _Track, evidence: _Evidence, after_s: float, now: float,
                cores: int) -> Optional[ThreadChange]:
        lasted = now - evidence.since
        if lasted + SLACK_S < after_s:
            return None
        change = ThreadChange(worker_id, track.threads, evidence.to,
                              reason(evidence.to < track.threads, evidence.other_s / lasted,
                                     evidence.steal_s / lasted, cores, lasted))
        self.tracks[worker_id] = _Track(evidence.to)  # the next evidence starts afresh
        return change


def _grow(evidence: Optional[_Evidence], now: float, load: CoreLoad, wanted: int,
          lowering: bool) -> _Evidence:
    """The evidence with one more interval agreeing. Intervals follow one another, except a
    worker's first (runner/watch/startup_load.py: from the job's start to its Ready), which spans the
    ticks before it: it then replaces the evidence they gave, which it holds."""
    start = now - load.interval_s
    if evidence is None or start <= evidence.since:
        evidence = _Evidence(start, wanted)
    evidence.add(load, wanted, lowering)
    return evidence


def reason(lowering: bool, other: float, steal: float, cores: int, lasted: float) -> str:
    """Why, in the log's words: 'about 1.0 core of other load on its 2 cores for 2 s'."""
    stolen = f" ({steal:.1f} of it CPU steal)" if steal >= 0.05 else ""
    if lowering:
        return (f"about {other:.1f} core{'' if round(other, 1) == 1 else 's'} of other load on its "
                f"{counted(cores, 'core')} for {lasted:.0f} s{stolen}")
    return f"its cores have been free for {lasted:.0f} s (other load about {other:.1f} core{stolen})"
