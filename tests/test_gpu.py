"""GPU offload's pure rules: settings, one worker per device, threads, the memory plan, the
variables that give a worker its one GPU. (This machine's llama.cpp is CPU-only: what reaches
llama.cpp is tested end to end in test_e2e.py.)"""

import pytest

from ggbatch.runner.config.schema import build_config
from ggbatch.runner.errors import ConfigError
from ggbatch.runner.plan.gpu import GPU_ALL, cpu_layer_share, gpu_layers_for, worker_threads
from ggbatch.runner.plan.layout import PromptFacts, settle, start, usable_cores
from ggbatch.runner.plan.memory import MIB, ModelDims, plan_memory
from ggbatch.runner.plan.vram import CUDA_CONTEXT, VRAM_SAFETY, budget, needed
from ggbatch.workers.devices import visible_device_env
from ggbatch.workers.helper_messages import GpuMemory

DIMS = ModelDims(file_bytes=400 * MIB, n_layer=28, n_embd=1024, n_head=8, n_head_kv=8, head_dim=128,
                 n_vocab=151936, n_ff=3072)
BASE = {"model": "m.gguf", "input": "q.jsonl", "output": "a.json"}


@pytest.mark.parametrize("value,expected", [("all", GPU_ALL), ("auto", None), ("12", 12), (0, 0), (99, 99)])
def test_gpu_layers_setting(value, expected):
    assert build_config([("command line", {**BASE, "model.n_gpu_layers": value})]).n_gpu_layers == expected


@pytest.mark.parametrize("value", ["-1", "some", True, 1.5])
def test_gpu_layers_setting_refused_names_the_key(value):
    with pytest.raises(ConfigError, match=r"model.n_gpu_layers: must be an integer >= 0, all or auto"):
        build_config([("job.yaml", {**BASE, "model.n_gpu_layers": value})])


@pytest.mark.parametrize("value,expected", [("0,1", (0, 1)), ([1, 0], (1, 0)), (2, (2,)), ("", ()), ([], ())])
def test_devices_setting(value, expected):
    assert build_config([("command line", {**BASE, "devices": value})]).devices == expected


@pytest.mark.parametrize("value,message", [("0,0", "each GPU once"), ("0,x", "GPU numbers"), ([-1], "GPU numbers")])
def test_devices_setting_refused(value, message):
    with pytest.raises(ConfigError, match=f"job.yaml: devices: must .*{message}"):
        build_config([("job.yaml", {**BASE, "devices": value})])


def test_auto_gpu_layers_are_all_on_given_devices_and_none_without():
    assert gpu_layers_for(None, (0, 1)) == GPU_ALL
    assert gpu_layers_for(None, ()) == 0
    assert gpu_layers_for(7, (0,)) == 7


def test_one_worker_per_device_each_pinned_to_its_share_of_the_cores():
    layout = start([0, 1, 2, 3, 4, 5, 6, 7], n_records=100, flags=frozenset(), devices=(1, 0), n_gpu_layers=GPU_ALL)
    assert (layout.workers, layout.threads, layout.devices) == (2, 4, (1, 0))
    assert layout.cores == ((0, 1, 2, 3), (4, 5, 6, 7))
    # A tuned CPU layout is not a GPU one.
    tuned = {"workers": 4, "threads": 2, "slots": 8, "repack": False}
    assert start([0, 1, 2, 3], n_records=100, flags=frozenset(), tuned=tuned, devices=(0,)).workers == 1


@pytest.mark.parametrize("workers,cores,message", [
    (3, [0, 1, 2, 3], "3 workers, but devices lists 2 GPUs"),
    (None, [0], "2 GPUs need a core each"),
])
def test_device_layout_refusals(workers, cores, message):
    with pytest.raises(ConfigError, match=message):
        start(cores, workers=workers, n_records=10, flags=frozenset(), devices=(0, 1))


def test_a_worker_with_every_layer_on_a_gpu_gets_one_thread_only_if_the_build_can_offload():
    assert worker_threads(8, True, GPU_ALL, offload=True) == 1
    assert worker_threads(8, True, GPU_ALL, offload=False) == 8  # CPU-only build: the layers stay
    assert worker_threads(8, True, 20, offload=True) == 8  # layers left on the CPU need the cores
    assert worker_threads(8, False, GPU_ALL, offload=True) == 8  # --threads is the job's word


def test_settle_keeps_ram_for_the_layers_left_on_the_cpu_and_says_vram_is_llama_cpps():
    cores = usable_cores()
    started = start(cores, n_records=16, flags=frozenset(), devices=(0,), n_gpu_layers=GPU_ALL)
    facts = PromptFacts(16, 100, 0, 0, DIMS)
    gpu, gpu_plan = settle(started, facts, max_tokens=64, n_batch=512, available=64 << 30, offload=True)
    cpu, cpu_plan = settle(started, facts, max_tokens=64, n_batch=512, available=64 << 30, offload=False)
    assert (gpu.threads, cpu.threads) == (1, len(cores))
    assert gpu_plan.kv_per_worker == 0 and gpu_plan.shared_file_pages == 0 and gpu_plan.cpu_share == 0.0
    assert "VRAM not planned" in gpu_plan.vram and "VRAM not planned" in gpu_plan.as_report()["vram"]
    assert cpu_plan.cpu_share == 1.0 and "every layer in RAM" in cpu_plan.vram


def test_partial_offload_plans_the_cpu_layers_share():
    # -ngl 15 on 28 layers: the output layer and 14 repeating layers on the GPU, 14 left in RAM.
    assert cpu_layer_share(15, 28, offload=True) == 0.5
    assert cpu_layer_share(15, 28, offload=False) == 1.0
    assert cpu_layer_share(GPU_ALL, 28, offload=True) == 0.0
    full = plan_memory(DIMS, 1, 4, lambda s: 4096, 512, available=64 << 30)
    half = plan_memory(DIMS, 1, 4, lambda s: 4096, 512, available=64 << 30, cpu_share=0.5)
    assert half.kv_per_worker == full.kv_per_worker // 2
    assert half.shared_file_pages == full.shared_file_pages // 2
    assert half.compute_per_worker == full.compute_per_worker  # logits and activations stay in RAM


def test_a_worker_sees_only_its_gpu_in_every_backend():
    env = visible_device_env(1, {})
    assert env == {"CUDA_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1", "MUSA_VISIBLE_DEVICES": "1",
                   "GGML_VK_VISIBLE_DEVICES": "1"}
    # A scheduler already gave the job GPUs 2 and 3: device 1 is the second of them.
    assert visible_device_env(1, {"CUDA_VISIBLE_DEVICES": "2,3"})["CUDA_VISIBLE_DEVICES"] == "3"


GIB = 1 << 30
H200 = GpuMemory("CUDA0", 140 * GIB, 141 * GIB)


def settle_on(gpus, devices=(0,), n_gpu_layers=GPU_ALL, questions=1000, longest=100, slots=None, workers=None,
              cores=None):
    started = start(cores or usable_cores(), workers=workers, n_records=questions, flags=frozenset(),
                    devices=devices, n_gpu_layers=n_gpu_layers)
    return settle(started, PromptFacts(questions, longest, 0, 0, DIMS), slots=slots, max_tokens=64,
                  available=64 * GIB, offload=True, cores=cores, gpus=gpus)


def test_with_the_gpus_memory_known_auto_slots_go_to_what_a_context_holds_and_fit_vram():
    layout, plan = settle_on([H200])
    assert layout.slots == 255 and plan.fits and not plan.note
    # 256 streams of 256 cells (164 tokens a sequence, padded) of 112 KiB, the weights, the
    # compute buffer of a 512-token step and the process's CUDA context
    kv = 256 * 256 * DIMS.kv_bytes_per_cell
    assert plan.vram_per_worker == DIMS.file_bytes + kv + 512 * (DIMS.n_vocab * 4 + DIMS.n_embd * 80) + CUDA_CONTEXT
    assert plan.as_report()["vram_per_worker_mib"] == round(plan.vram_per_worker / MIB, 1)
    assert plan.vram == "VRAM planned on GPU 0 (CUDA0: 143,360 MiB free)"
    assert settle_on([H200], questions=40)[0].slots == 40  # never more slots than questions


def test_a_small_gpu_gets_fewer_slots_and_says_so():
    layout, plan = settle_on([GpuMemory("CUDA0", 4 * GIB, 8 * GIB)])
    assert layout.slots == 63 and plan.fits  # 255 -> 127 -> 63: halved until the KV cache fits
    assert plan.vram_per_worker <= 4 * GIB * VRAM_SAFETY < needed(DIMS, 128 * 256, 127, 512, 1.0)
    assert "shrunk from 1 worker × 255 slots to fit" in plan.note and "CUDA0: 4,096 MiB free" in plan.note


def test_a_model_larger_than_the_free_vram_is_refused_with_the_numbers():
    with pytest.raises(ConfigError, match=r"not enough memory for one worker with one slot: .*VRAM 1,\d{3} MiB "
                                          r"a worker; VRAM planned on GPU 0 \(CUDA0: 512 MiB free\)"):
        settle_on([GpuMemory("CUDA0", 512 * MIB, 8 * GIB)])


def test_one_worker_per_device_each_fitting_its_own_gpu():
    small, big = GpuMemory("CUDA0", 2 * GIB, 8 * GIB), GpuMemory("CUDA1", 80 * GIB, 80 * GIB)
    assert budget([small, big], (1, 0), 2) == budget([small, big], (0,), 1)  # the fuller one decides
    assert budget([small, big], (1, 0), 1).where == "GPU 1 (CUDA1: 81,920 MiB free)"
    assert budget([small], (1,), 1) is None and budget([], (0,), 1) is None  # not planned
    # GPU 0 cannot hold a worker with 1 slot (1.3 GiB at least): the worker on it goes, and the
    # other keeps GPU 1 and its slots.
    layout, plan = settle_on([GpuMemory("CUDA0", 600 * MIB, 8 * GIB), big], devices=(1, 0), cores=[0, 1])
    assert (layout.workers, layout.devices, layout.slots) == (1, (1,), 255) and plan.fits
    assert "shrunk from 2 workers" in plan.note and "GPU 1 (CUDA1" in plan.vram


def test_workers_splitting_their_layers_over_the_gpus_share_them():
    two = [GpuMemory("CUDA0", 2 * GIB, 8 * GIB), GpuMemory("CUDA1", 2 * GIB, 8 * GIB)]
    one, both = budget(two, (), 1), budget(two, (), 2)
    assert one.per_worker == int(4 * GIB * VRAM_SAFETY) and both.per_worker == one.per_worker // 2
    assert one.gpus_per_worker == 2 and "shared by 2 workers" in both.where
    # a CUDA context on each GPU a worker uses
    assert needed(DIMS, 256, 1, 512, 1.0, gpus=2) - needed(DIMS, 256, 1, 512, 1.0) == CUDA_CONTEXT
    layout, plan = settle_on(two, devices=(), workers=2, cores=[0, 1])
    assert plan.fits and plan.vram_per_worker <= both.per_worker < needed(DIMS, 2 * 256 * 256, 255, 512, 1.0, 2)


def test_unknown_gpus_or_layers_left_on_the_cpu_keep_the_cpu_slot_cap():
    layout, plan = settle_on([])  # a build that cannot say: llama.cpp fits VRAM or fails the load
    assert layout.slots == 64 and "VRAM not planned" in plan.vram and plan.vram_per_worker == 0
    layout, plan = settle_on([H200], n_gpu_layers=15)  # half the layers in RAM: the CPU sets the pace
    assert layout.slots == 64 and 0 < plan.vram_per_worker < settle_on([H200], slots=64)[1].vram_per_worker
    # the output layer is offloaded first: with half the repeating layers, more than half the weights
    assert needed(DIMS, 0, 1, 1, 0.5) - needed(DIMS, 0, 1, 1, 0.0) > DIMS.file_bytes // 2


def test_the_gpus_llama_cpp_would_offload_to():
    from ggbatch.workers.llama.gpu_memory import Device, offload_targets

    found = [Device("CPU", 0, "CPU", "", 64 * GIB, 64 * GIB), Device("CUDA0", 1, "CUDA", "0000:01:00.0", 70, 80),
             Device("Vulkan0", 1, "Vulkan", "0000:01:00.0", 71, 80),  # the same card under another backend
             Device("RPC0", 1, "RPC", "", 50, 60),  # another machine's
             Device("iGPU", 2, "Vulkan", "", 9, 10),  # its memory is RAM
             Device("CUDA1", 1, "CUDA", "0000:02:00.0", 0, 0),  # could not say its memory
             Device("CUDA2", 1, "CUDA", "", 30, 40)]
    assert offload_targets(found) == (GpuMemory("CUDA0", 70, 80), GpuMemory("CUDA2", 30, 40))


def test_llama_cpps_devices_are_read_and_this_cpu_build_offers_no_gpu():
    import llama_cpp

    from ggbatch.runner.pool.gpu_probe import free_gpu_memory
    from ggbatch.workers.llama import gpu_memory

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("a GPU build: its first device is a GPU")
    cpu = gpu_memory.devices()[0]
    assert (cpu.name, cpu.kind, cpu.backend) == ("CPU", 0, "CPU") and 0 < cpu.free <= cpu.total
    assert gpu_memory.gpus() == () and free_gpu_memory() == ()  # the probe process says the same
