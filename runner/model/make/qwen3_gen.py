"""Random-weight `qwen3` (attention with RMS-normed queries and keys) and `qwen3moe` (the same
attention, a mixture of experts for the FFN) models.

Tensor names, shapes and hyper-parameter keys as llama.cpp reads them (src/models/qwen3.cpp,
qwen3moe.cpp, src/llama-arch.cpp, in the llama.cpp that llama-cpp-python 0.3.36 vendors). The
head size is the model's own (key_length), not n_embd / n_head, as in the released Qwen3 models.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from .gguf_random import TensorSpec
from .shape import AttentionShape


@dataclass(frozen=True, kw_only=True)
class Qwen3Shape(AttentionShape):
    """Tied embeddings and a rope base of 1e6 by default, as the small released Qwen3 models."""

    arch = "qwen3"
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-6
    tied_embeddings: bool = True
    std_by_width: bool = True

    def layer_specs(self, i: int) -> list[TensorSpec]:
        e = self.n_embd
        return [(f"blk.{i}.attn_norm.weight", (e,)), *self.attention_specs(i, qk_norm=True),
                (f"blk.{i}.ffn_norm.weight", (e,)), *self.ffn_specs(i)]


@dataclass(frozen=True, kw_only=True)
class Qwen3MoeShape(Qwen3Shape):
    """n_expert experts of n_ff_exp rows each, n_expert_used of them per token (a router,
    ffn_gate_inp, picks them). All of them are in the file and in memory, whichever a token uses."""

    arch = "qwen3moe"
    n_expert: int
    n_expert_used: int
    n_ff_exp: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError(f"n_expert_used must be from 1 to n_expert: {self}")

    def ffn_specs(self, i: int) -> list[TensorSpec]:
        e, ff, n = self.n_embd, self.n_ff_exp, self.n_expert
        return [(f"blk.{i}.ffn_gate_inp.weight", (n, e)), (f"blk.{i}.ffn_gate_exps.weight", (n, ff, e)),
                (f"blk.{i}.ffn_up_exps.weight", (n, ff, e)), (f"blk.{i}.ffn_down_exps.weight", (n, e, ff))]

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        super().add_hyperparameters(writer)
        writer.add_expert_count(self.n_expert)
        writer.add_expert_used_count(self.n_expert_used)
        writer.add_expert_feed_forward_length(self.n_ff_exp)
