"""A random-weight `mamba2` model: a pure state-space model, no attention and no KV cache.

Tensor names, shapes and hyper-parameter keys as llama.cpp reads them (src/models/mamba2.cpp,
src/llama-arch.cpp, and its converter conversion/mamba.py, in the llama.cpp that
llama-cpp-python 0.3.36 vendors). Its memory is one recurrent state per sequence, which llama.cpp
cannot cut back to a position: what ggbatch's tests of recurrent memory need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import gguf
import numpy as np

from .gguf_random import TensorSpec
from .shape import Shape

ARCH = "mamba2"


@dataclass(frozen=True, kw_only=True)
class Mamba2Shape(Shape):
    """d_inner = 2 × n_embd (as the converter requires); heads of head_dim over d_inner."""

    arch = ARCH
    d_state: int
    head_dim: int
    d_conv: int = 4
    n_group: int = 1
    std_by_width: bool = True

    def __post_init__(self) -> None:
        if self.d_inner % self.head_dim or self.d_inner % self.n_group:
            raise ValueError(f"d_inner (2 × n_embd) must divide by head_dim and n_group: {self}")

    @property
    def d_inner(self) -> int:
        return 2 * self.n_embd

    @property
    def n_head(self) -> int:  # llama.cpp's ssm_dt_rank
        return self.d_inner // self.head_dim

    def layer_specs(self, i: int) -> list[TensorSpec]:
        """Numpy shapes: llama.cpp's ne reversed (llama_model_mamba2::load_arch_tensors)."""
        e, inner, heads = self.n_embd, self.d_inner, self.n_head
        conv_dim = inner + 2 * self.n_group * self.d_state
        return [
            (f"blk.{i}.attn_norm.weight", (e,)),
            (f"blk.{i}.ssm_in.weight", (inner + conv_dim + heads, e)),
            (f"blk.{i}.ssm_conv1d.weight", (conv_dim, self.d_conv)),
            (f"blk.{i}.ssm_conv1d.bias", (conv_dim,)),
            (f"blk.{i}.ssm_dt.bias", (heads,)),
            (f"blk.{i}.ssm_a", (heads, 1)),
            (f"blk.{i}.ssm_d", (heads, 1)),
            (f"blk.{i}.ssm_norm.weight", (self.n_group, inner // self.n_group)),
            (f"blk.{i}.ssm_out.weight", (e, inner)),
        ]

    def add_hyperparameters(self, writer: gguf.GGUFWriter) -> None:
        super().add_hyperparameters(writer)
        writer.add_feed_forward_length(0)  # unused, but llama.cpp reads it (as the converter writes it)
        writer.add_head_count(0)
        writer.add_ssm_conv_kernel(self.d_conv)
        writer.add_ssm_inner_size(self.d_inner)
        writer.add_ssm_state_size(self.d_state)
        writer.add_ssm_time_step_rank(self.n_head)
        writer.add_ssm_group_count(self.n_group)
        writer.add_layer_norm_rms_eps(self.rms_eps)

    def fill(self, name: str, shape: tuple[int, ...]) -> Optional[np.ndarray]:
        """The tensors a trained model holds fixed kinds of values in: A < 0 (the state decays;
        the converter stores -exp(A_log)), time steps dt = softplus(x + bias) from 0.01 to 0.1 as
        Mamba initialises them (the state then remembers some hundred tokens), D (the path around
        the state) at 0 so that the state carries the whole answer: a test then sees a wrong state
        in the text. The group norm at 1, the convolution's bias at 0."""
        if name.endswith(".ssm_a"):
            return -np.linspace(0.5, 2.0, shape[0], dtype=np.float32).reshape(shape)
        if name.endswith(".ssm_dt.bias"):
            return np.log(np.expm1(np.geomspace(0.01, 0.1, shape[0]))).astype(np.float32)
        if name.endswith(".ssm_d"):
            return np.zeros(shape, dtype=np.float32)
        if name.endswith(".ssm_norm.weight"):
            return np.ones(shape, dtype=np.float32)
        if name.endswith(".bias"):
            return np.zeros(shape, dtype=np.float32)
        return None
