"""The seam between the worker's loop (workers/main.py) and what answers its questions.

The worker knows an engine only as `Engine`, and gets it from the `EngineFactory` its WorkerSpec
carries: llama.cpp's (workers/llama/factory.py) by default, a fake one in the coordinator's tests.
A factory crosses into the spawned worker, so it is picklable and loads nothing until asked.
"""

from __future__ import annotations

from typing import Protocol

from ..protocol import Answer, EngineConfig, Question
from .memory_kind import MemoryKind


class Engine(Protocol):
    """What a worker drives. The fake engine of the coordinator tests implements the same."""

    slots: int
    memory_kind: MemoryKind  # what the model's KV memory can do (recurrent and hybrid: whole streams only)

    @property
    def n_threads(self) -> int:
        """llama.cpp's thread count now."""
        ...

    def set_threads(self, n: int) -> int:
        """Run the next steps on n threads; returns the count llama.cpp then reports (an engine
        that cannot change it returns its count unchanged)."""
        ...

    def add(self, question: Question) -> None: ...

    def step(self) -> list[Answer]: ...

    @property
    def n_unfinished(self) -> int: ...

    def stats(self) -> dict[str, float]: ...

    def drop_waiting(self) -> int: ...

    def close(self, keep_weights: bool = False) -> None:
        """Free the engine; keep_weights: its weights stay loaded for the next engine the factory
        builds (a worker's engine built again in place, workers/main.py _Engines)."""
        ...


class EngineFactory(Protocol):
    """Builds a worker's engine in two steps: the weights load at start-up, while the coordinator
    is still tokenizing; the engine itself once its settings (a Configure message) arrive."""

    def preload(self, model_path: str, repack: bool, n_gpu_layers: int, one_device: bool) -> tuple[int, int]:
        """Load the weights. Returns (the n_gpu_layers the library was given, the layers it put on a GPU)."""
        ...

    def build(self, config: EngineConfig, worker_id: int) -> Engine:
        """The engine for these settings, on the weights preload loaded."""
        ...
