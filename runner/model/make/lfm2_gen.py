"""A random-weight `lfm2` model: a hybrid of short-convolution layers (a recurrent state per
sequence) and attention layers (a KV cache), as Liquid AI's LFM2.

Tensor names, shapes and hyper-parameter keys as llama.cpp reads them (src/models/lfm2.cpp,
src/llama-arch.cpp, and its converter conversion/lfm2.py, in the llama.cpp that llama-cpp-python
0.3.36 vendors): a layer is attention where its head_count_kv is non-zero, convolution elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from .gguf_random import TensorSpec
from .shape import AttentionShape

ARCH = "lfm2"


@dataclass(frozen=True, kw_only=True)
class Lfm2Shape(AttentionShape):
    """attention_layers: the indices of the attention layers; the others are convolutions of
    l_cache taps. Tied embeddings by default, as the released LFM2 models."""

    arch = ARCH
    attention_layers: tuple[int, ...]
    l_cache: int = 3
    rope_freq_base: float = 1e6
    tied_embeddings: bool = True
    std_by_width: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not set(self.attention_layers) <= set(range(self.n_layer)):
            raise ValueError(f"attention_layers must be layer indices below n_layer: {self}")

    def layer_specs(self, i: int) -> list[TensorSpec]:
        """Numpy shapes: llama.cpp's ne reversed (llama_model_lfm2::load_arch_tensors)."""
        e = self.n_embd
        specs: list[TensorSpec] = [(f"blk.{i}.attn_norm.weight", (e,)), (f"blk.{i}.ffn_norm.weight", (e,)),
                                   *self.ffn_specs(i)]
        if i in self.attention_layers:
            return specs + self.attention_specs(i, qk_norm=True)
        return specs + [(f"blk.{i}.shortconv.conv.weight", (e, self.l_cache)),
                        (f"blk.{i}.shortconv.in_proj.weight", (3 * e, e)),
                        (f"blk.{i}.shortconv.out_proj.weight", (e, e))]

    def output_specs(self, n_vocab: int, norm: str = "token_embd_norm.weight") -> list[TensorSpec]:
        return super().output_specs(n_vocab, norm)  # llama.cpp's name for LFM2's output norm

    def head_count_kv(self) -> int | list[int]:
        return [self.n_head_kv if i in self.attention_layers else 0 for i in range(self.n_layer)]

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        super().add_hyperparameters(writer)
        writer.add_shortconv_l_cache(self.l_cache)
