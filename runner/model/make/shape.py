"""The one base of every generated model's shape: what all architectures share (layers, width,
context, norm epsilon, tied output), and the attention block most of them build on.

An architecture's module (llama_gen.py, qwen3_gen.py, gemma3_gen.py, mamba2_gen.py, lfm2_gen.py,
qwen35_gen.py) subclasses one of these with its own fields and says its tensors (numpy shapes,
llama.cpp's ne reversed), its hyper-parameters and the tensors that must not be random;
gguf_random.py writes the file. Fields are keyword-only, so a subclass adds fields with and
without defaults freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import gguf
import numpy as np

from .gguf_random import WEIGHT_STD, TensorSpec


@dataclass(frozen=True, kw_only=True)
class Shape:
    """``tied_embeddings``: no ``output.weight``; llama.cpp then computes the logits with
    ``token_embd.weight``, as small models that share the two matrices do."""

    arch: ClassVar[str]
    n_layer: int
    n_embd: int
    n_ctx: int
    rms_eps: float = 1e-5
    tied_embeddings: bool = False
    # Matrices N(0, 1/sqrt(n_embd)) instead of WEIGHT_STD: large enough that what a sequence's
    # state, window or experts hold changes its next token (tests compare answers that depend on
    # the whole prompt; with tied embeddings and small weights a model repeats its last token),
    # small enough to stay finite.
    std_by_width: bool = False

    @property
    def weight_std(self) -> float:
        # tied: the embedding rows give the logits too, and at WEIGHT_STD the prompt's last token
        # outscores every other, so greedy decoding repeated it ('????????????')
        return self.n_embd ** -0.5 if self.std_by_width or self.tied_embeddings else WEIGHT_STD

    @property
    def output_rows(self) -> str:
        """The tensor whose rows give the logits (gguf_random.py silences special tokens there)."""
        return "token_embd.weight" if self.tied_embeddings else "output.weight"

    def tensor_specs(self, n_vocab: int) -> list[TensorSpec]:
        specs: list[TensorSpec] = [("token_embd.weight", (n_vocab, self.n_embd))]
        for i in range(self.n_layer):
            specs += self.layer_specs(i)
        return specs + self.output_specs(n_vocab)

    def layer_specs(self, i: int) -> list[TensorSpec]:
        raise NotImplementedError

    def output_specs(self, n_vocab: int, norm: str = "output_norm.weight") -> list[TensorSpec]:
        specs: list[TensorSpec] = [(norm, (self.n_embd,))]
        return specs if self.tied_embeddings else [*specs, ("output.weight", (n_vocab, self.n_embd))]

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        writer.add_context_length(self.n_ctx)
        writer.add_embedding_length(self.n_embd)
        writer.add_block_count(self.n_layer)

    def fill(self, name: str, shape: tuple[int, ...]) -> Optional[np.ndarray]:
        """A tensor's own values where N(0, weight_std) (or 1 for vectors) would be wrong."""
        return None


@dataclass(frozen=True, kw_only=True)
class AttentionShape(Shape):
    """Attention with grouped KV heads and a gated FFN. ``head_dim`` 0: n_embd // n_head (else
    written as the key and value length, as Qwen3 and Gemma 3 have their own)."""

    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim_override: int = 0
    rope_freq_base: float = 10000.0

    def __post_init__(self) -> None:
        if (self.n_embd % self.n_head and not self.head_dim_override) or self.n_head % self.n_head_kv:
            raise ValueError(f"n_embd must divide by n_head and n_head by n_head_kv: {self}")

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.n_embd // self.n_head

    def attention_specs(self, i: int, q_rows: int = 0, qk_norm: bool = False) -> list[TensorSpec]:
        """q_rows: rows of attn_q when it is not n_head × head_dim (Qwen3.5's query and gate)."""
        e, q, kv = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        specs: list[TensorSpec] = [
            (f"blk.{i}.attn_q.weight", (q_rows or q, e)), (f"blk.{i}.attn_k.weight", (kv, e)),
            (f"blk.{i}.attn_v.weight", (kv, e)), (f"blk.{i}.attn_output.weight", (e, q))]
        if qk_norm:
            specs += [(f"blk.{i}.attn_q_norm.weight", (self.head_dim,)),
                      (f"blk.{i}.attn_k_norm.weight", (self.head_dim,))]
        return specs

    def ffn_specs(self, i: int) -> list[TensorSpec]:
        e, ff = self.n_embd, self.n_ff
        return [(f"blk.{i}.ffn_gate.weight", (ff, e)), (f"blk.{i}.ffn_up.weight", (ff, e)),
                (f"blk.{i}.ffn_down.weight", (e, ff))]

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        super().add_hyperparameters(writer)
        writer.add_feed_forward_length(self.n_ff)
        writer.add_head_count(self.n_head)
        writer.add_head_count_kv(self.head_count_kv())
        self.add_rope(writer)
        writer.add_layer_norm_rms_eps(self.rms_eps)

    def head_count_kv(self) -> int | list[int]:
        """One count, or one per layer (0 where a hybrid's layer has no attention)."""
        return self.n_head_kv

    def add_rope(self, writer: gguf.GGUFWriter) -> None:
        if self.head_dim_override:
            writer.add_key_length(self.head_dim)
            writer.add_value_length(self.head_dim)
        writer.add_rope_freq_base(self.rope_freq_base)
