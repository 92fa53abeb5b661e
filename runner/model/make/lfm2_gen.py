"""A random-weight `lfm2` model: a hybrid of short-convolution layers (a recurrent state per
sequence) and attention layers (a KV cache), as Liquid AI's LFM2.

Tensor names, shapes and hyper-parameter keys as llama.cpp reads them (src/models/lfm2.cpp,
src/llama-arch.cpp, and its converter conversion/lfm2.py, in the llama.cpp that llama-cpp-python
0.3.36 vendors): a layer is attention where its head_count_kv is non-zero, convolution elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import gguf
import numpy as np

from .gguf_random import TensorSpec

ARCH = "lfm2"


@dataclass(frozen=True)
class Lfm2Shape:
    """attention_layers: the indices of the attention layers; the others are convolutions of
    l_cache taps. Tied embeddings by default, as the released LFM2 models."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int
    attention_layers: tuple[int, ...]
    l_cache: int = 3
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-5
    tied_embeddings: bool = True
    arch: str = ARCH

    @property
    def weight_std(self) -> float:
        """1/sqrt(n_embd): large enough that what a sequence's state holds changes its next
        token (tests compare answers that depend on the whole prompt), small enough to stay finite."""
        return self.n_embd ** -0.5

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"n_embd must divide by n_head and n_head by n_head_kv: {self}")
        if not set(self.attention_layers) <= set(range(self.n_layer)):
            raise ValueError(f"attention_layers must be layer indices below n_layer: {self}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def tensor_specs(self, n_vocab: int) -> list[TensorSpec]:
        """Numpy shapes: llama.cpp's ne reversed (llama_model_lfm2::load_arch_tensors)."""
        e, kv, ff = self.n_embd, self.n_head_kv * self.head_dim, self.n_ff
        specs: list[TensorSpec] = [("token_embd.weight", (n_vocab, e))]
        for i in range(self.n_layer):
            specs += [(f"blk.{i}.attn_norm.weight", (e,)), (f"blk.{i}.ffn_norm.weight", (e,)),
                      (f"blk.{i}.ffn_gate.weight", (ff, e)), (f"blk.{i}.ffn_up.weight", (ff, e)),
                      (f"blk.{i}.ffn_down.weight", (e, ff))]
            if i in self.attention_layers:
                specs += [(f"blk.{i}.attn_q_norm.weight", (self.head_dim,)),
                          (f"blk.{i}.attn_k_norm.weight", (self.head_dim,)),
                          (f"blk.{i}.attn_q.weight", (e, e)), (f"blk.{i}.attn_k.weight", (kv, e)),
                          (f"blk.{i}.attn_v.weight", (kv, e)), (f"blk.{i}.attn_output.weight", (e, e))]
            else:
                specs += [(f"blk.{i}.shortconv.conv.weight", (e, self.l_cache)),
                          (f"blk.{i}.shortconv.in_proj.weight", (3 * e, e)),
                          (f"blk.{i}.shortconv.out_proj.weight", (e, e))]
        specs.append(("token_embd_norm.weight", (e,)))  # llama.cpp's name for LFM2's output norm
        if not self.tied_embeddings:
            specs.append(("output.weight", (n_vocab, e)))
        return specs

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        writer.add_context_length(self.n_ctx)
        writer.add_embedding_length(self.n_embd)
        writer.add_block_count(self.n_layer)
        writer.add_feed_forward_length(self.n_ff)
        writer.add_head_count(self.n_head)
        writer.add_head_count_kv([self.n_head_kv if i in self.attention_layers else 0
                                  for i in range(self.n_layer)])
        writer.add_rope_freq_base(self.rope_freq_base)
        writer.add_layer_norm_rms_eps(self.rms_eps)
        writer.add_shortconv_l_cache(self.l_cache)

    def fill(self, name: str, shape: tuple[int, ...]) -> Optional[np.ndarray]:
        return None  # every tensor as gguf_random writes it: norms at 1, the rest random
