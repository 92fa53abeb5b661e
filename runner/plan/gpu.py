"""GPU offload, the coordinator's rules: how many layers, one worker per device, the CPU threads
of a GPU worker, the share of the model left in RAM for the memory plan. Pure functions.

    model.n_gpu_layers (--gpu-layers N|all|auto) ──▶ WorkerSpec.n_gpu_layers ──▶ llama.cpp's model params
    devices (--devices 0,1) ──▶ one worker per device ──▶ WorkerSpec.device ──▶ workers/devices.py

Whether the layers really reach a GPU depends on the llama.cpp build, which only a process that
loads llama.cpp can tell (llama_supports_gpu_offload): the tokenizer process says so
(VocabInfo.gpu_offload) before the layout is settled, so a CPU-only build keeps the CPU layout
and memory plan, with one warning.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..config.checks import GPU_ALL
from ..errors import ConfigError
from ..words import counted

# llama.cpp threads of a worker whose every layer is on a GPU. Only the input embedding lookup
# stays on the CPU then (llama.cpp keeps the input layer there: "very little benefit to
# offloading" it), a row copy per token; every other op runs on the GPU while the CPU threads
# wait for it. One thread, as llama.cpp's own default was for fully offloaded CUDA models
# (llama.cpp pull request 2915: more than one thread brings no benefit there and adds overhead).
# The worker stays pinned to its whole share of cores, for its Python (sampling, detokenizing)
# and the GPU driver's own threads. A worker that keeps layers on the CPU needs its cores for
# them and gets the CPU layout's threads.
GPU_WORKER_THREADS = 1


def gpu_layers_for(requested: Optional[int], devices: Sequence[int]) -> int:
    """The layers to offload: as asked, or auto: all of them on the given devices, none without."""
    if requested is not None:
        return requested
    return GPU_ALL if devices else 0


def gpu_layers_text(n_gpu_layers: Optional[int]) -> Union[int, str, None]:
    """As the report and the messages show it: a count, or "all"."""
    return "all" if n_gpu_layers is not None and n_gpu_layers < 0 else n_gpu_layers


def workers_for_devices(devices: Sequence[int], workers: Optional[int], n_cores: int) -> int:
    """One worker per device; refuses a worker count that says otherwise, or too few cores."""
    if workers is not None and workers != len(devices):
        raise ConfigError(f"workers: {counted(workers, 'worker')}, but devices lists {counted(len(devices), 'GPU')} "
                          "(one worker per device; leave workers on auto)")
    if len(devices) > n_cores:
        raise ConfigError(f"devices: {len(devices)} GPUs need a core each for their workers, "
                          f"{n_cores} are usable here")
    return len(devices)


def worker_threads(threads: int, threads_auto: bool, n_gpu_layers: int, offload: bool) -> int:
    """llama.cpp threads per worker once the build is known (`offload`: it can offload)."""
    if offload and threads_auto and n_gpu_layers < 0:
        return min(threads, GPU_WORKER_THREADS)
    return threads


# Auto slots of a worker whose every layer is on a GPU whose memory the plan counts: as many as
# llama.cpp holds in a context (256 sequences, one of them the shared prefix's), shrunk to fit
# VRAM by the memory plan. Unlike CPU threads a GPU keeps gaining from more sequences a step: on
# an H200 llama-batched-bench generated 11,000 tokens/s at 64 sequences and 16,800 at 255
# (docs/performance/gpu.md).
GPU_MAX_AUTO_SLOTS = 255


def auto_slot_cap(cap: int, cpu_share: float, vram_planned: bool) -> int:
    """The most auto slots: the CPU's cap, or GPU_MAX_AUTO_SLOTS with every layer on GPUs whose
    free memory the plan counts."""
    return GPU_MAX_AUTO_SLOTS if cpu_share == 0.0 and vram_planned else cap


def cpu_layer_share(n_gpu_layers: int, n_layer: int, offload: bool) -> float:
    """The share of the repeating layers (their weights and KV cache) left in RAM. llama.cpp
    offloads the output layer first, then the last n_gpu_layers - 1 repeating layers."""
    if not offload or n_gpu_layers == 0:
        return 1.0
    if n_gpu_layers < 0 or n_layer <= 0:
        return 0.0
    return max(0, n_layer - (n_gpu_layers - 1)) / n_layer


def vram_note(n_gpu_layers: int, offload: bool) -> str:
    """What the memory plan says of VRAM: nothing planned, llama.cpp's to fit."""
    if n_gpu_layers == 0:
        return ""
    if not offload:
        return "no GPU offload in this llama.cpp build: every layer in RAM"
    return (f"VRAM not planned: llama.cpp stores {gpu_layers_text(n_gpu_layers)} layers there, with their KV "
            "cache, and fails the load if they do not fit; RAM planned for the layers left on the CPU")


def offload_warning(n_gpu_layers: int) -> str:
    """The one warning of a job asking for GPU layers from a CPU-only build."""
    return (f"model.n_gpu_layers {gpu_layers_text(n_gpu_layers)}: this llama-cpp-python build has no GPU "
            "offload (llama_supports_gpu_offload() is false), so every layer stays on the CPU; "
            "docs/guide/gpu.md says how to install a CUDA or Metal build")
