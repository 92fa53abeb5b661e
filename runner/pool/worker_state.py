"""What the pool knows of one worker across its lives (runner/pool/pool.py keeps one per worker): its
spec, this life's link and messages, the questions it holds, its engine's counters (this life's
and its earlier lives' summed), and how it reads in the report and the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from ...workers.protocol import EngineStats, Question, Ready
from ...workers.spec import WorkerSpec
from .backend import Link
from .worker_run import WorkerRun
from .worker_threads import ThreadCount


@dataclass
class WorkerState:
    """One worker as the pool sees it; WorkerLives.start (runner/pool/lives.py) begins a new life
    (link, ready, wants, threads)."""

    spec: WorkerSpec
    link: Optional[Link] = None  # this life of the worker, as its backend gives it (None: not running)
    ready: Optional[Ready] = None
    wants: int = 0
    in_flight: dict[str, Question] = field(default_factory=dict)
    solo: bool = False  # holds one group of suspects and nothing else (runner/pool/crashes.py)
    engine_stats: dict[str, float] = field(default_factory=dict)  # this life's engine counters, as last sent
    engine_earlier: dict[str, float] = field(default_factory=dict)  # its earlier lives' (lives_total)
    live: Optional[EngineStats] = None  # this life's counters, as last sent
    earlier: Optional[EngineStats] = None  # the counters of its earlier lives, summed
    restarts: int = 0
    contexts: int = 0  # engines it has built (a Ready each): at each start and each growth in place
    outdated: bool = False  # to build the pool's new engine once it holds nothing
    last_error: str = ""  # the WorkerError it sent, if any, in this life
    threads: ThreadCount = field(default_factory=ThreadCount)  # llama.cpp's, in this life

    def awaiting_engine(self) -> None:
        """An engine is to be built (a new life's, or a growth's in place): nothing of the last one
        stands until its Ready, neither its readiness, its wants, nor its thread count."""
        self.ready, self.wants, self.outdated = None, 0, False
        self.threads = ThreadCount()

    def end_life(self) -> None:
        """Its life ended (a death, or a restart with a new engine): its counters join its earlier
        lives', so the report counts the work it did before as well."""
        self.earlier, self.live = added(self.earlier, self.live), None
        self.engine_earlier, self.engine_stats = lives_total(self.engine_earlier, self.engine_stats), {}

    def engine_totals(self) -> dict[str, float]:
        """Its engine's counters over all its lives."""
        return lives_total(self.engine_earlier, self.engine_stats)


def worker_run(w: WorkerState) -> WorkerRun:
    """What the worker did, for the report."""
    ready = w.ready
    return WorkerRun(worker_id=w.spec.worker_id, cores=w.spec.cores, restarts=w.restarts,
                     load_s=ready.load_s if ready else None, contexts=w.contexts,
                     n_threads=ready.n_threads if ready else None, engine=w.engine_totals(), device=w.spec.device,
                     n_gpu_layers=ready.n_gpu_layers if ready else None, gpu_layers=ready.gpu_layers if ready else None,
                     node=node(w.spec), memory=ready.memory if ready else None)


def node(spec: WorkerSpec) -> Optional[dict[str, str]]:
    """The Ray node a worker lives on, for the report; None for a local process."""
    return {"node_id": spec.node_id, "ip": spec.node_ip or ""} if spec.node_id else None


def on_node(spec: WorkerSpec) -> str:
    """Where a worker lives, for a log line: "" for a local process."""
    return f" (on node {spec.node_ip} {spec.node_id[:12]})" if spec.node_id else ""


def lives_total(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    """Two lives' engine counters (workers/engine/step_counters.py): summed, a peak the larger."""
    return {k: max(a.get(k, 0.0), b.get(k, 0.0)) if k.endswith("_peak") else a.get(k, 0.0) + b.get(k, 0.0)
            for k in {**a, **b}}


def added(a: Optional[EngineStats], b: Optional[EngineStats]) -> Optional[EngineStats]:
    """Two lives' counters summed (either may be None: no stats yet)."""
    if a is None or b is None:
        return a or b
    return EngineStats(a.worker_id, a.steps + b.steps, a.busy_slots + b.busy_slots,
                       a.generated_tokens + b.generated_tokens, a.prompt_tokens + b.prompt_tokens)
