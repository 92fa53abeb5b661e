"""Noticing a worker that holds questions but makes no progress: stopped (SIGSTOP, a debugger),
swapping, or starved of CPU. Its CPU time, sampled by the monitor, stops growing; the progress
line alone would go on saying "ETA 0 s" with no word. Pure: fed samples, it returns what to say."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..child_processes import STATE_HINTS

STALL_S = 10.0  # seconds without CPU progress, while holding questions, before saying so
MIN_CPU_S = 0.05  # CPU seconds that count as progress between two samples


@dataclass
class _Track:
    cpu_s: float
    since: float  # when the CPU time last grew (or the worker got questions)
    stalled: bool = False


@dataclass
class StallWatch:
    stall_s: float = STALL_S
    tracks: dict[int, _Track] = field(default_factory=dict)
    stalls: int = 0

    def sample(self, worker_id: int, cpu_s: float, in_flight: int, state: str, now: float,
               slots: Optional[int] = None) -> Optional[str]:
        """One sample of one worker; returns a line to log when it starts or stops stalling.
        in_flight: the questions it holds; slots: how many of them it decodes at once (None: not
        known yet), the others waiting at the worker."""
        t = self.tracks.get(worker_id)
        if t is None or cpu_s < t.cpu_s:  # first sample, or a restarted process
            self.tracks[worker_id] = _Track(cpu_s, now)
            return None
        progressing = cpu_s - t.cpu_s >= MIN_CPU_S or in_flight == 0
        if progressing:
            was_stalled = t.stalled
            self.tracks[worker_id] = _Track(cpu_s, now)
            return f"worker {worker_id} is making progress again" if was_stalled else None
        if not t.stalled and now - t.since >= self.stall_s:
            t.stalled = True
            self.stalls += 1
            decoding = f" ({min(in_flight, slots)} decoding)" if slots else ""
            return (f"worker {worker_id} has made no progress for {now - t.since:.0f} s with {in_flight} "
                    f"questions held{decoding} (process state: {state}{STATE_HINTS.get(state, '')})")
        return None

    def forget(self, worker_id: int) -> None:
        self.tracks.pop(worker_id, None)

