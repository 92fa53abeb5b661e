"""The memory plan on each architecture, read from the made models' GGUF headers: a recurrent
state has a fixed size per sequence (mamba2 has no attention KV at all), a hybrid's KV counts only
its attention layers, a sliding window's layers are marked, and a mixture of experts holds all
its experts (the file's size)."""

from __future__ import annotations

import pytest

from ggbatch.runner.model.gguf_header import read_hparams
from ggbatch.runner.model.make import modelgen as mg
from ggbatch.runner.plan.layers import layer_memory
from ggbatch.runner.plan.memory import MIB, ModelDims, dims_from_metadata, plan_memory

F16, F32 = 2, 4


@pytest.fixture(scope="module")
def headers(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("headers")
    names = ["demo", "qwen3-tiny", "qwen3moe-tiny", "gemma3-tiny", "mamba2-tiny", "lfm2-tiny", "qwen35-tiny"]
    return {name: read_hparams(str(mg.make_model(folder / f"{name}.gguf", name))) for name in names}


def test_the_header_gives_per_layer_values_the_metadata_text_lacks(headers):
    assert headers["lfm2-tiny"]["lfm2.attention.head_count_kv"] == [0, 2, 0, 2]
    assert headers["gemma3-tiny"]["gemma3.attention.sliding_window"] == 16
    assert not any(key.startswith("tokenizer.") for key in headers["demo"])


def test_attention_kv_per_cell_counts_each_layers_heads_and_head_size(headers):
    demo = layer_memory(headers["demo"])  # 2 layers × 2 KV heads × (16 + 16) × f16
    assert (demo.kv_bytes_per_cell, demo.state_bytes_per_seq) == (2 * 2 * 32 * F16, 0)
    qwen3 = layer_memory(headers["qwen3-tiny"])  # its own head size: 32, not 64 / 4
    assert qwen3.kv_bytes_per_cell == 2 * 2 * 64 * F16


def test_a_recurrent_state_is_per_sequence_and_mamba2_has_no_kv(headers):
    mamba = layer_memory(headers["mamba2-tiny"])
    conv = 3 * (128 + 2 * 16)  # (d_conv - 1) × (d_inner + 2 × n_group × d_state)
    assert mamba.kv_bytes_per_cell == 0
    assert mamba.state_bytes_per_seq == 2 * (conv + 16 * 128) * F32
    lfm2 = layer_memory(headers["lfm2-tiny"])  # two attention layers, two convolutions of 3 taps
    assert lfm2.kv_bytes_per_cell == 2 * 2 * 32 * F16
    assert lfm2.state_bytes_per_seq == 2 * 64 * 2 * F32
    qwen35 = layer_memory(headers["qwen35-tiny"])  # DeltaNet in 3 layers, attention in 1
    assert qwen35.kv_bytes_per_cell == 1 * 2 * 32 * F16
    assert qwen35.state_bytes_per_seq == 3 * (3 * (64 + 2 * 2 * 16) + 16 * 64) * F32


def test_a_sliding_window_and_experts_are_known(headers):
    gemma = layer_memory(headers["gemma3-tiny"])  # layer 0 slides, layer 1 sees everything
    assert gemma.n_swa == 16 and gemma.swa_kv_bytes_per_cell == gemma.kv_bytes_per_cell // 2
    moe = layer_memory(headers["qwen3moe-tiny"])
    assert (moe.n_expert, moe.n_expert_used) == (8, 2)


def test_the_plan_counts_state_per_sequence_not_per_cell(headers):
    def dims(name: str) -> ModelDims:
        return dims_from_metadata(lambda key: None, 100 * MIB, 1000, headers[name])

    mamba = dims("mamba2-tiny")
    small, long = (plan_memory(mamba, 1, 8, lambda slots, n=n: slots * n, 512, 1 << 40) for n in (256, 4096))
    assert small.kv_per_worker == long.kv_per_worker == 9 * mamba.state_bytes_per_seq
    demo = dims("demo")
    assert plan_memory(demo, 1, 8, lambda s: s * 4096, 512, 1 << 40).kv_per_worker > \
        plan_memory(demo, 1, 8, lambda s: s * 256, 512, 1 << 40).kv_per_worker
    # Every expert is in memory: the plan's weights are the file's, whatever a token uses.
    moe = plan_memory(dims("qwen3moe-tiny"), 2, 4, lambda s: s * 256, 512, 1 << 40, repacked=False)
    assert moe.shared_file_pages == 100 * MIB
