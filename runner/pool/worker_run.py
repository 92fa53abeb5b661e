"""What the report says of each worker: the pool's account of it at the end of a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True, kw_only=True)
class WorkerRun:
    """One worker as the pool saw it, for the report (runner/pool/pool.py fills these)."""

    worker_id: int
    cores: tuple[int, ...]
    restarts: int
    load_s: Optional[float]  # spawn to ready, last life, and its engines built again in place since
    contexts: int  # engines built (contexts): at each start and each growth
    n_threads: Optional[int]  # as llama.cpp reports it
    engine: Mapping[str, float]  # the engine's step counters, all its lives
    device: Optional[int] = None  # the GPU it was given (--devices)
    n_gpu_layers: Optional[int] = None  # what llama.cpp was given (negative: all layers)
    gpu_layers: Optional[int] = None  # layers llama.cpp says it offloaded
    node: Optional[Mapping[str, str]] = None  # the Ray node it lived on ({node_id, ip}); None: this machine
    memory: Optional[str] = None  # the model's memory as its engine found it (workers/engine/memory_kind.py)
