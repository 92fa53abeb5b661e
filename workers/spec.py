"""What a worker process is started with (the engine's settings follow in a Configure message,
workers/protocol.py). Picklable: it crosses into the spawned process or the Ray actor."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Optional

from .engine.interface import EngineFactory
from .llama.factory import LLAMA_ENGINE


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to start: it pins itself and loads the model while the coordinator is
    still tokenizing; the engine's settings follow in a Configure message."""

    worker_id: int
    cores: tuple[int, ...]  # the worker pins itself to these before loading the model
    model_path: str
    _: KW_ONLY  # the rest by name
    # What builds the engine inside the worker: llama.cpp's, or the coordinator tests' fake engine.
    engine_factory: EngineFactory = LLAMA_ENGINE
    # Load the weights into llama.cpp's CPU_REPACK layout. Decided before the worker starts,
    # because the model loads before its Configure arrives; EngineConfig.repack says the same.
    # Off unless the plan turns it on, as EngineConfig.repack.
    repack: bool = False
    # Where the worker's stderr goes (llama.cpp writes its asserts and aborts there): the
    # coordinator owns the terminal and quotes the last line when the worker dies.
    log_path: Optional[str] = None
    # Layers llama.cpp stores in VRAM (a negative value: all of them), set at load like repack.
    n_gpu_layers: int = 0
    # The one GPU this worker may see (--devices), made the only visible one before llama.cpp
    # loads (workers/devices.py); None: every GPU llama.cpp finds, split by layer as it does.
    device: Optional[int] = None
    # The Ray node the worker lives on (runner/pool/ray.py): its id and IP; None for a local
    # process. Its cores are then positions in that node's usable cores (workers/ray_actor.py).
    node_id: Optional[str] = None
    node_ip: Optional[str] = None
