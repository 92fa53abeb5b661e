from dataclasses import replace

import pytest

from ggbatch.runner.plan.memory import MIB, ModelDims, allocated_kv_cells, dims_from_metadata, fit_layout, plan_memory

# The 28 × 1024 benchmark shape: 8 KV heads × 128 head size → 28 × 8 × 128 × 2 × 2 = 114,688 B per cell.
DIMS = ModelDims(file_bytes=400 * MIB, n_layer=28, n_embd=1024, n_head=8, n_head_kv=8, head_dim=128,
                 n_vocab=151936, n_ff=3072)


def cells(slots):
    return 1000 * slots


def test_kv_bytes_per_cell():
    assert DIMS.kv_bytes_per_cell == 114_688


def test_plan_adds_private_weights_kv_per_worker_and_shared_pages_once():
    plan = plan_memory(DIMS, 2, 4, cells, 512, available=64 << 30)
    assert plan.kv_cells_per_worker == 4096  # 4000 rounded up to a multiple of 256, as llama.cpp does
    assert plan.kv_per_worker == 4096 * 114_688
    assert plan.weights_per_worker == int(400 * MIB * 0.4)
    assert plan.total == 2 * (plan.weights_per_worker + plan.kv_per_worker + plan.compute_per_worker) + 400 * MIB
    assert plan.fits and not plan.note


def test_every_kv_cell_costs_its_bookkeeping_in_ram_even_with_the_layers_on_a_gpu():
    short = plan_memory(DIMS, 1, 4, lambda s: 4096, 512, available=1 << 40)
    long = plan_memory(DIMS, 1, 4, lambda s: 4 * 524_288, 512, available=1 << 40)
    assert long.compute_per_worker - short.compute_per_worker == (4 * 524_288 - 4096) * 48
    on_gpu = plan_memory(DIMS, 1, 4, lambda s: 4 * 524_288, 512, available=1 << 40, cpu_share=0.0)
    assert on_gpu.kv_per_worker == 0 and on_gpu.compute_per_worker == long.compute_per_worker
    from ggbatch.runner.plan.layers import LayerMemory
    recurrent = replace(DIMS, layers=LayerMemory(kv_bytes_per_cell=0, swa_kv_bytes_per_cell=0, n_swa=0,
                                                 state_bytes_per_seq=1 << 20, n_expert=0, n_expert_used=0))
    assert plan_memory(recurrent, 1, 4, lambda s: 4 * 524_288, 512, available=1 << 40).compute_per_worker == \
        plan_memory(recurrent, 1, 4, lambda s: 4096, 512, available=1 << 40).compute_per_worker  # no cells


def test_a_model_with_sliding_window_layers_keeps_the_record_of_its_cells_twice():
    # llama_kv_cache_iswa: a cache for the windowed layers and one for the rest, each with its
    # cells. gemma3-tiny at 4 slots × 524,288 tokens: PSS 1,583.5 MiB, 135.6 MiB past the plan
    # that counted one record a cell.
    from ggbatch.runner.plan.layers import LayerMemory
    windowed = replace(DIMS, layers=LayerMemory(kv_bytes_per_cell=114_688, swa_kv_bytes_per_cell=81_920,
                                                n_swa=512, state_bytes_per_seq=0, n_expert=0, n_expert_used=0))
    assert windowed.kv_caches == 2 and DIMS.kv_caches == 1
    short = plan_memory(windowed, 1, 4, lambda s: 4096, 512, available=1 << 40)
    long = plan_memory(windowed, 1, 4, lambda s: 4 * 524_288, 512, available=1 << 40)
    assert long.compute_per_worker - short.compute_per_worker == (4 * 524_288 - 4096) * 48 * 2


def test_plan_matches_the_measured_benchmark_model():
    # 28 × 1024 Q4_K_M, 2 workers × 16 slots, 2911 KV cells each: measured 1,304 MiB PSS in all.
    dims = ModelDims(432_746_144, 28, 1024, 16, 8, 64, 151936, 3072)
    plan = plan_memory(dims, 2, 16, lambda s: 2911, 512, available=24 << 30)
    assert abs(plan.total / MIB - 1304) / 1304 < 0.10


def test_shrinks_slots_first_then_workers():
    need_2x16 = plan_memory(DIMS, 2, 16, cells, 512, available=1 << 40).total
    plan = fit_layout(DIMS, 2, 16, cells, 512, available=int(need_2x16 / 0.9) - 1)
    assert (plan.workers, plan.slots) == (2, 8) and plan.fits
    assert "shrunk from 2 workers × 16 slots" in plan.note
    one_worker = plan_memory(DIMS, 1, 1, cells, 512, available=1 << 40).total
    plan = fit_layout(DIMS, 2, 16, cells, 512, available=int(one_worker / 0.9) + 1)
    assert (plan.workers, plan.slots) == (1, 1) and plan.fits


def test_refuses_when_one_worker_with_one_slot_does_not_fit():
    plan = fit_layout(DIMS, 2, 16, cells, 512, available=200 * MIB)
    assert not plan.fits and (plan.workers, plan.slots) == (1, 1)


@pytest.mark.parametrize("available,fits", [(8 << 30, True), (300 * MIB, False)])
def test_fits_flag(available, fits):
    assert plan_memory(DIMS, 1, 4, cells, 512, available).fits is fits


def test_dims_from_gguf_metadata():
    meta = {"general.architecture": "qwen2", "qwen2.block_count": "28", "qwen2.embedding_length": "1024",
            "qwen2.attention.head_count": "16", "qwen2.attention.head_count_kv": "8",
            "qwen2.feed_forward_length": "3072"}
    dims = dims_from_metadata(meta.get, 123, 151936)
    assert (dims.n_layer, dims.head_dim, dims.n_head_kv, dims.n_ff, dims.file_bytes) == (28, 64, 8, 3072, 123)


@pytest.mark.parametrize("n_ctx,n_seq_max,unified,cells", [
    (13_845, 65, False, 65 * 256),  # 64 slots + the prefix sequence, 213 tokens each
    (13_845, 65, True, 14_080),  # one pool: padded once
    (4_000, 1, False, 4_096),
    (33 * 600, 33, False, 33 * 768),  # 19,800 padded to 19,968 -> 605 a stream -> 768
])
def test_allocated_kv_cells_as_llama_cpp_pads_them(n_ctx, n_seq_max, unified, cells):
    assert allocated_kv_cells(n_ctx, n_seq_max, unified) == cells


def test_plan_matches_the_measured_64_slot_run():
    # 28 × 1024 Q4_K_M, 1 worker × 64 slots, 213 tokens per sequence, per-sequence streams:
    # measured peak PSS 1,641 MiB (the plan said 1,470 before the per-stream padding).
    dims = ModelDims(432_746_144, 28, 1024, 16, 8, 64, 151936, 3072)
    plan = plan_memory(dims, 1, 64, lambda s: allocated_kv_cells((s + 1) * 213, s + 1, False), 512,
                       available=24 << 30)
    assert abs(plan.total / MIB - 1641) / 1641 < 0.10


def test_without_repacking_a_worker_holds_no_private_weights():
    repacked = plan_memory(DIMS, 2, 4, cells, 512, available=64 << 30)
    plain = plan_memory(DIMS, 2, 4, cells, 512, available=64 << 30, repacked=False)
    assert plain.weights_per_worker == 0
    assert repacked.total - plain.total == 2 * int(400 * MIB * 0.4)


@pytest.mark.parametrize("repacked,measured_pss_mib", [(True, 1156), (False, 996)])
def test_plan_matches_w1_with_and_without_repacking(repacked, measured_pss_mib):
    # W1 (32 GSM8K questions) on the 28 × 1024 Q4_K_M model: 1 worker × 32 slots, 8,448 KV cells.
    dims = ModelDims(432_746_144, 28, 1024, 16, 8, 64, 151936, 3072)
    plan = plan_memory(dims, 1, 32, lambda s: 8448, 512, available=24 << 30, repacked=repacked)
    assert abs(plan.total / MIB - measured_pss_mib) / measured_pss_mib < 0.05


def test_a_job_scoring_continuations_plans_a_logits_row_for_each_token_of_a_step():
    # The demo shape with a 151,936-token vocabulary, scoring 4 records × 4 continuations of 300
    # words (n_batch 1024): measured 1,278 MiB PSS, where the plan counted a row a slot (125 MiB).
    dims = ModelDims(42_930_000, 2, 64, 2, 2, 32, 151936, 256)
    generating = plan_memory(dims, 1, 4, lambda s: 2560, 1024, available=24 << 30)
    scoring = plan_memory(dims, 1, 4, lambda s: 2560, 1024, available=24 << 30, scored_rows=1024)
    assert scoring.compute_per_worker - generating.compute_per_worker == (1024 * 2 - 4) * 151936 * 4
    assert abs(scoring.total / MIB - 1278) / 1278 < 0.10
    assert generating.total / MIB < 200
