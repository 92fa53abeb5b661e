"""A random-weight `gemma3` model: attention whose layers mostly see only the last
``sliding_window`` positions, with one layer in ``swa_pattern`` seeing them all.

Tensor names, shapes and hyper-parameter keys as llama.cpp reads them (src/models/gemma3.cpp,
src/llama-arch.cpp, llama_model_base::load_swa_pattern, in the llama.cpp that
llama-cpp-python 0.3.36 vendors). Gemma's norms multiply by (1 + w); its converter stores w + 1,
so the norms at 1 that gguf_random.py writes are a trained model's starting point.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from .gguf_random import TensorSpec
from .shape import AttentionShape


@dataclass(frozen=True, kw_only=True)
class Gemma3Shape(AttentionShape):
    """Layer i slides over ``sliding_window`` positions unless (i + 1) is a multiple of
    ``swa_pattern`` (llama.cpp's set_swa_pattern); local layers rotate with rope base 10,000,
    global ones with rope_freq_base. Tied embeddings, as every released Gemma 3."""

    arch = "gemma3"
    sliding_window: int
    swa_pattern: int = 6
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-6
    tied_embeddings: bool = True
    std_by_width: bool = True

    def swa_layers(self) -> list[int]:
        return [i for i in range(self.n_layer) if i % self.swa_pattern < self.swa_pattern - 1]

    def layer_specs(self, i: int) -> list[TensorSpec]:
        e = self.n_embd
        return [(f"blk.{i}.attn_norm.weight", (e,)), *self.attention_specs(i, qk_norm=True),
                (f"blk.{i}.post_attention_norm.weight", (e,)), (f"blk.{i}.ffn_norm.weight", (e,)),
                *self.ffn_specs(i), (f"blk.{i}.post_ffw_norm.weight", (e,))]

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        super().add_hyperparameters(writer)
        writer.add_sliding_window(self.sliding_window)
        writer.add_sliding_window_pattern(self.swa_pattern)
        writer.add_rope_freq_base_swa(10000.0)
