"""A random-weight `llama` model: the plain attention architecture of the demo and benchmark models."""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from .gguf_random import TensorSpec
from .shape import AttentionShape


@dataclass(frozen=True, kw_only=True)
class LlamaShape(AttentionShape):
    """Hyper-parameters of a llama-architecture model (head_dim = n_embd // n_head)."""

    arch = "llama"

    def layer_specs(self, i: int) -> list[TensorSpec]:
        e = self.n_embd
        return [(f"blk.{i}.attn_norm.weight", (e,)), *self.attention_specs(i),
                (f"blk.{i}.ffn_norm.weight", (e,)), *self.ffn_specs(i)]

    def add_rope(self, writer: gguf.GGUFWriter) -> None:
        writer.add_rope_dimension_count(self.head_dim)
        super().add_rope(writer)
