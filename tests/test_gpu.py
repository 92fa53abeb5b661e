"""GPU offload's pure rules: settings, one worker per device, threads, the memory plan, the
variables that give a worker its one GPU. (This machine's llama.cpp is CPU-only: what reaches
llama.cpp is tested end to end in test_e2e.py.)"""

import pytest

from ggbatch.runner.config.schema import build_config
from ggbatch.runner.errors import ConfigError
from ggbatch.runner.plan.gpu import GPU_ALL, cpu_layer_share, gpu_layers_for, worker_threads
from ggbatch.runner.plan.layout import PromptFacts, settle, start, usable_cores
from ggbatch.runner.plan.memory import MIB, ModelDims, plan_memory
from ggbatch.workers.devices import visible_device_env

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
    layout = start([0, 1, 2, 3, 4, 5, 6, 7], None, None, None, None, 100, frozenset(), devices=(1, 0),
                   n_gpu_layers=GPU_ALL)
    assert (layout.workers, layout.threads, layout.devices) == (2, 4, (1, 0))
    assert layout.cores == ((0, 1, 2, 3), (4, 5, 6, 7))
    # A tuned CPU layout is not a GPU one.
    tuned = {"workers": 4, "threads": 2, "slots": 8, "repack": False}
    assert start([0, 1, 2, 3], None, None, None, None, 100, frozenset(), tuned, devices=(0,)).workers == 1


@pytest.mark.parametrize("workers,cores,message", [
    (3, [0, 1, 2, 3], "3 workers, but devices lists 2 GPUs"),
    (None, [0], "2 GPUs need a core each"),
])
def test_device_layout_refusals(workers, cores, message):
    with pytest.raises(ConfigError, match=message):
        start(cores, workers, None, None, None, 10, frozenset(), devices=(0, 1))


def test_a_worker_with_every_layer_on_a_gpu_gets_one_thread_only_if_the_build_can_offload():
    assert worker_threads(8, True, GPU_ALL, offload=True) == 1
    assert worker_threads(8, True, GPU_ALL, offload=False) == 8  # CPU-only build: the layers stay
    assert worker_threads(8, True, 20, offload=True) == 8  # layers left on the CPU need the cores
    assert worker_threads(8, False, GPU_ALL, offload=True) == 8  # --threads is the job's word


def test_settle_keeps_ram_for_the_layers_left_on_the_cpu_and_says_vram_is_llama_cpps():
    cores = usable_cores()
    started = start(cores, None, None, None, None, 16, frozenset(), devices=(0,), n_gpu_layers=GPU_ALL)
    facts = PromptFacts(16, 100, 0, 0, DIMS)
    gpu, gpu_plan = settle(started, facts, None, None, 64, 512, 64 << 30, offload=True)
    cpu, cpu_plan = settle(started, facts, None, None, 64, 512, 64 << 30, offload=False)
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
