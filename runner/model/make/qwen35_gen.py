"""A random-weight `qwen35` model (Qwen3.5): a hybrid of Gated DeltaNet layers (linear attention,
a recurrent state per sequence) and gated full-attention layers (a KV cache), one in
``full_attention_interval``.

Tensor names, shapes and hyper-parameter keys as llama.cpp reads them (src/models/qwen35.cpp,
delta-net-base.cpp, src/llama-arch.cpp, and its converter conversion/qwen.py, in the llama.cpp
that llama-cpp-python 0.3.36 vendors). A DeltaNet layer has n_k_heads key heads and n_v_heads
value heads of d_state each; an attention layer's query projection holds the query and its gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import gguf
import numpy as np

from .gguf_random import TensorSpec
from .shape import AttentionShape


@dataclass(frozen=True, kw_only=True)
class Qwen35Shape(AttentionShape):
    """Rope over a quarter of each head, in the four sections of Qwen3.5's interleaved M-RoPE (a
    text prompt gives every section the same position). Tied embeddings, as the small ones."""

    arch = "qwen35"
    d_state: int  # a DeltaNet head's key and value size
    n_k_heads: int  # llama.cpp's ssm_group_count
    n_v_heads: int  # llama.cpp's ssm_time_step_rank
    full_attention_interval: int = 4
    d_conv: int = 4
    rope_freq_base: float = 1e7
    rms_eps: float = 1e-6
    tied_embeddings: bool = True
    std_by_width: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_v_heads % self.n_k_heads or self.head_dim % 8:
            raise ValueError(f"n_v_heads must divide by n_k_heads and head_dim by 8: {self}")

    def attention_layers(self) -> list[int]:
        return [i for i in range(self.n_layer) if (i + 1) % self.full_attention_interval == 0]

    def layer_specs(self, i: int) -> list[TensorSpec]:
        e = self.n_embd
        norms: list[TensorSpec] = [(f"blk.{i}.attn_norm.weight", (e,)),
                                   (f"blk.{i}.post_attention_norm.weight", (e,))]
        if i in self.attention_layers():
            mixer = self.attention_specs(i, q_rows=2 * self.n_head * self.head_dim, qk_norm=True)
        else:
            mixer = self._delta_net_specs(i)
        return norms + mixer + self.ffn_specs(i)

    def _delta_net_specs(self, i: int) -> list[TensorSpec]:
        """llama_model_qwen35::load_arch_tensors, ne reversed."""
        e, key_dim, value_dim = self.n_embd, self.d_state * self.n_k_heads, self.d_state * self.n_v_heads
        return [(f"blk.{i}.attn_qkv.weight", (2 * key_dim + value_dim, e)),
                (f"blk.{i}.attn_gate.weight", (value_dim, e)),
                (f"blk.{i}.ssm_conv1d.weight", (2 * key_dim + value_dim, self.d_conv)),
                (f"blk.{i}.ssm_dt.bias", (self.n_v_heads,)), (f"blk.{i}.ssm_a", (self.n_v_heads,)),
                (f"blk.{i}.ssm_beta.weight", (self.n_v_heads, e)),
                (f"blk.{i}.ssm_alpha.weight", (self.n_v_heads, e)),
                (f"blk.{i}.ssm_norm.weight", (self.d_state,)), (f"blk.{i}.ssm_out.weight", (e, value_dim))]

    def add_rope(self, writer: gguf.GGUFWriter) -> None:
        n_rot = self.head_dim // 4  # partial_rotary_factor 0.25, as the converter writes it
        half = n_rot // 2
        writer.add_key_length(self.head_dim)
        writer.add_value_length(self.head_dim)
        writer.add_rope_dimension_count(n_rot)
        writer.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
        writer.add_rope_freq_base(self.rope_freq_base)

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        super().add_hyperparameters(writer)
        writer.add_ssm_conv_kernel(self.d_conv)
        writer.add_ssm_inner_size(self.d_state * self.n_v_heads)
        writer.add_ssm_state_size(self.d_state)
        writer.add_ssm_time_step_rank(self.n_v_heads)
        writer.add_ssm_group_count(self.n_k_heads)
        writer.add_full_attention_interval(self.full_attention_interval)

    def fill(self, name: str, shape: tuple[int, ...]) -> Optional[np.ndarray]:
        """The decay -exp(A_log) < 0 and its time steps softplus(x + dt_bias) from 0.01 to 0.1, as
        for mamba2 (mamba2_gen.py): the state then remembers some hundred tokens."""
        if name.endswith(".ssm_a"):
            return -np.linspace(0.5, 2.0, shape[0], dtype=np.float32)
        if name.endswith(".ssm_dt.bias"):
            return np.log(np.expm1(np.geomspace(0.01, 0.1, shape[0]))).astype(np.float32)
        return None
