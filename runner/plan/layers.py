"""What each layer of a model holds per sequence and per token, from its GGUF header's
hyper-parameters (runner/model/gguf_header.py read_hparams): pure arithmetic, as llama.cpp sizes
its memory (llama_hparams::n_embd_r / n_embd_s, llama_kv_cache_iswa).

- An attention layer holds K and V (f16) per KV cell: n_head_kv × (key_length + value_length) × 2
  bytes. A layer with a sliding window needs only its last n_swa cells per sequence, but
  ggbatch keeps llama.cpp's full-size window cache (swa_full, its default): a prompt that starts
  from cells another prompt decoded needs the positions before its start, which a
  window-sized cache may have overwritten.
- A recurrent layer (Mamba, Gated DeltaNet, LFM2's short convolution) holds a state of a fixed
  size per sequence, f32, however long the sequence: a convolution window
  (d_conv - 1) × (d_inner + 2 × n_group × d_state), or LFM2's n_embd × (l_cache - 1), and the
  SSM state d_state × d_inner.
- A mixture of experts holds every expert's weights whichever a token uses: the file's size
  counts them all, as the plan does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ..model.gguf_header import HParam

F16, F32 = 2, 4


@dataclass(frozen=True)
class LayerMemory:
    kv_bytes_per_cell: int  # over the attention layers, the windowed ones included
    swa_kv_bytes_per_cell: int  # the part of it in layers with a sliding window
    n_swa: int
    state_bytes_per_seq: int  # over the recurrent layers
    n_expert: int
    n_expert_used: int


def layer_memory(hp: Mapping[str, HParam]) -> LayerMemory:
    arch = str(hp.get("general.architecture", "llama"))

    def num(key: str, default: int = 0) -> int:
        value = hp.get(f"{arch}.{key}", default)
        return int(value) if isinstance(value, (int, float)) else default

    n_layer, n_embd = num("block_count", 1), num("embedding_length", 1)
    n_head = num("attention.head_count", 1)
    head_dim = n_embd // n_head if n_head else 0
    kv_heads = _per_layer(hp.get(f"{arch}.attention.head_count_kv", n_head), n_layer)
    recurrent = _recurrent_layers(hp, arch, n_layer, kv_heads)
    cell = [0 if recurrent[i] else kv_heads[i] * (num("attention.key_length", head_dim)
                                                   + num("attention.value_length", head_dim)) * F16
            for i in range(n_layer)]
    swa = _swa_layers(hp, arch, n_layer) if num("attention.sliding_window") else [False] * n_layer
    return LayerMemory(sum(cell), sum(c for c, s in zip(cell, swa) if s), num("attention.sliding_window"),
                       sum(recurrent) * _state_bytes(num), num("expert_count"), num("expert_used_count"))


def hybrid_memory(hp: Mapping[str, HParam]) -> bool:
    """Whether the model has attention layers and recurrent ones (LFM2, Qwen3.5, Granite 4.0-H, Jamba)."""
    memory = layer_memory(hp)
    return memory.kv_bytes_per_cell > 0 and memory.state_bytes_per_seq > 0


def _per_layer(value: HParam, n_layer: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value[:n_layer]] + [0] * (n_layer - len(value))
    return [int(value) if isinstance(value, (int, float)) else 0] * n_layer


def _recurrent_layers(hp: Mapping[str, HParam], arch: str, n_layer: int, kv_heads: list[int]) -> list[bool]:
    """Which layers hold a recurrent state: all of them in a model with no attention heads (Mamba);
    those marked so, or all but one in full_attention_interval (Qwen3-Next, Qwen3.5); those with
    no KV heads in a hybrid that lists them per layer (LFM2, Granite 4.0-H, Jamba)."""
    marked = hp.get(f"{arch}.attention.recurrent_layers")
    if isinstance(marked, list):
        return [bool(v) for v in marked[:n_layer]]
    interval = hp.get(f"{arch}.full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return [(i + 1) % interval != 0 for i in range(n_layer)]
    has_state = f"{arch}.ssm.state_size" in hp or f"{arch}.shortconv.l_cache" in hp
    return [has_state and heads == 0 for heads in kv_heads]


def _swa_layers(hp: Mapping[str, HParam], arch: str, n_layer: int) -> list[bool]:
    """llama.cpp's set_swa_pattern: layer i slides unless (i + 1) is a multiple of the pattern; an
    array marks each layer. Without a pattern every attention layer is counted as full."""
    pattern = hp.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return [bool(v) for v in pattern[:n_layer]]
    if isinstance(pattern, int) and pattern > 0:
        return [i % pattern < pattern - 1 for i in range(n_layer)]
    return [False] * n_layer


def _state_bytes(num: Callable[[str], int]) -> int:
    """One recurrent layer's state per sequence (llama_hparams::n_embd_r + n_embd_s), f32."""
    l_cache = num("shortconv.l_cache")
    if l_cache:
        return num("embedding_length") * (l_cache - 1) * F32
    d_conv, d_inner, d_state = num("ssm.conv_kernel"), num("ssm.inner_size"), num("ssm.state_size")
    conv = max(d_conv - 1, 0) * (d_inner + 2 * num("ssm.group_count") * d_state)
    return (conv + d_state * d_inner) * F32
