"""llama.cpp's engine as an EngineFactory (workers/engine/interface.py): what every worker builds
unless its WorkerSpec names another. Nothing here loads llama.cpp until a method runs, so the
coordinator can name the factory without importing the library."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..protocol import EngineConfig
    from .engine import LlamaEngine


@dataclass(frozen=True)
class LlamaEngineFactory:
    def preload(self, model_path: str, repack: bool, n_gpu_layers: int, one_device: bool) -> tuple[int, int]:
        from .model_runner import preload_model

        offload = preload_model(model_path, repack, n_gpu_layers, one_device)
        return offload.n_gpu_layers, offload.gpu_layers

    def build(self, config: EngineConfig, worker_id: int) -> LlamaEngine:
        from .engine import LlamaEngine

        return LlamaEngine(config, worker_id)


LLAMA_ENGINE = LlamaEngineFactory()
