"""The run's timeline: a light sample every few seconds of what the run did, for the report
(`timeline`) and `ggbatch plot`.

    RunWatch.tick ──every EVERY_S──▶ Sample(counters of the pool's engines, the monitor's figures)
    Timeline.as_report() ──▶ [{t_s, done, tokens and their rates, busy slots, per worker ...}]

A sample holds counters (since the run started: questions done, tokens, engine steps, busy
slot-steps, CPU seconds) and gauges (PSS, OS and llama.cpp thread counts, other processes' load
on the worker's cores, as last measured). Rates and means are
differences of counters between consecutive samples, taken when the report is written, so
thinning the list loses resolution, never totals: past MAX_SAMPLES every other sample is dropped
and the interval doubles, which bounds a day-long run to a few hundred samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

EVERY_S = 2.0
MAX_SAMPLES = 300
MIB = 1 << 20


@dataclass(frozen=True)
class WorkerPoint:
    generated: int  # tokens, over all its lives
    prompt: int  # prompt tokens decoded
    steps: int
    busy_slots: int  # summed over steps
    cpu_s: Optional[float]  # user + system, over all its lives (None: not sampled yet)
    pss: int  # bytes, as last measured (the monitor measures PSS every few samples)
    threads: int  # OS threads, as last sampled
    llama_threads: Optional[int] = None  # llama.cpp's, as the worker last said (runner/watch/thread_controller.py)
    other_load: Optional[float] = None  # cores' worth of other processes on its cores, last interval


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the job started
    done: int  # questions finished in this run, failed ones included
    failed: int
    workers: dict[int, WorkerPoint] = field(default_factory=dict)


class Timeline:
    def __init__(self, every_s: float = EVERY_S, max_samples: int = MAX_SAMPLES) -> None:
        self.every_s = every_s
        self.max_samples = max_samples
        self.samples: list[Sample] = []

    def due(self, t: float) -> bool:
        return not self.samples or t - self.samples[-1].t >= self.every_s

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        if len(self.samples) > self.max_samples:
            # Every other sample, counting back from the newest (the end of the run stays).
            self.samples = self.samples[::-2][::-1]
            self.every_s *= 2

    def as_report(self) -> list[dict[str, Any]]:
        """The report's `timeline`: each sample with the rates and means since the one before."""
        rows = []
        for i, cur in enumerate(self.samples):
            prev = self.samples[i - 1] if i else None
            workers = {wid: _worker_row(point, prev.workers.get(wid) if prev else None,
                                        cur.t - prev.t if prev else 0.0)
                       for wid, point in sorted(cur.workers.items())}
            rows.append({"t_s": round(cur.t, 2), "done": cur.done, "failed": cur.failed,
                         **_totals(workers.values()), "workers": {str(w): row for w, row in workers.items()}})
        return rows


def _worker_row(cur: WorkerPoint, prev: Optional[WorkerPoint], dt: float) -> dict[str, Any]:
    """One worker at one sample: its counters, and rates and means since `prev` (dt seconds
    before; a worker first seen has its token counters start from 0, its CPU time not)."""
    zero = WorkerPoint(0, 0, 0, 0, None, 0, 0)
    before = prev or zero
    steps = cur.steps - before.steps
    def rate(now: float, then: float) -> Optional[float]:
        return round(max(0, now - then) / dt, 1) if dt > 0 else None
    cpu = (round(100.0 * max(0.0, cur.cpu_s - before.cpu_s) / dt, 1)
           if dt > 0 and cur.cpu_s is not None and before.cpu_s is not None else None)
    return {"generated_tokens": cur.generated, "prompt_tokens": cur.prompt,
            "generated_per_s": rate(cur.generated, before.generated), "prompt_per_s": rate(cur.prompt, before.prompt),
            # None: no step ended in the interval (the worker idle, or in one long step)
            "busy_slots": round((cur.busy_slots - before.busy_slots) / steps, 2) if steps > 0 else None,
            "cpu_percent": cpu, "pss_mib": round(cur.pss / MIB, 1), "threads": cur.threads,
            "llama_threads": cur.llama_threads,
            "other_load": round(cur.other_load, 2) if cur.other_load is not None else None}


def _totals(workers: Any) -> dict[str, Any]:
    rows = list(workers)

    def total(key: str) -> Any:
        values = [r[key] for r in rows if r[key] is not None]
        return round(sum(values), 2) if values else None

    return {"generated_tokens": total("generated_tokens"), "prompt_tokens": total("prompt_tokens"),
            "generated_per_s": total("generated_per_s"), "prompt_per_s": total("prompt_per_s"),
            "busy_slots": total("busy_slots")}
