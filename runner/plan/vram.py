"""The memory plan's VRAM side: what a worker's layers on a GPU need there, and what the GPUs
have free (read before any worker loads: runner/pool/gpu_probe.py). Pure arithmetic, like
runner/plan/memory.py, whose fit_layout shrinks the layout until RAM and VRAM both fit.

A worker with layers on a GPU holds there:
- their weights: the GGUF file's share of them (the input embedding stays in RAM: counted
  anyway, a margin), and with some layers left on the CPU the output layer too, which llama.cpp
  offloads first (counted as f16, at most what it takes);
- their KV cache: the same cells and bytes per cell as the RAM plan counts;
- llama.cpp's compute buffer on the device, which holds a step's logits (n_batch rows of n_vocab
  floats at most: llama.cpp sizes it for a whole step of outputs) and activations;
- a CUDA context and library workspaces on every GPU it uses (CUDA_CONTEXT each).

With `devices` each worker has one GPU of its own: each of those must hold a worker. Without, a
worker's layers are split by llama.cpp over every GPU it sees, and the workers share them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence

from ...workers.helper_messages import GpuMemory
from .memory import ACTIVATION_BYTES, MIB, ModelDims

CUDA_CONTEXT = 512 * MIB  # a process's CUDA context, cuBLAS and flash-attention workspaces, per GPU
VRAM_SAFETY = 0.9  # of the free memory: other processes, fragmentation


@dataclass(frozen=True)
class VramBudget:
    per_worker: int  # bytes one worker may plan for
    gpus_per_worker: int  # GPUs one worker's layers are on (a CUDA context on each)
    where: str  # which GPUs, and how much they had free


class VramCheck(NamedTuple):
    need: int  # bytes one worker needs
    fits: bool
    where: str


def budget(gpus: Sequence[GpuMemory], devices: Sequence[int], workers: int) -> Optional[VramBudget]:
    """What one of `workers` workers may plan for: with devices (one each, the first `workers` of
    them), the least free among theirs; without, every GPU's free memory shared out. None: no GPU
    known, or a device llama.cpp does not see (VRAM is then llama.cpp's to fit, unplanned)."""
    if not gpus or any(d >= len(gpus) for d in devices):
        return None
    if devices:
        d = min(devices[:workers], key=lambda i: gpus[i].free)
        return VramBudget(int(gpus[d].free * VRAM_SAFETY), 1, f"GPU {d} ({_free(gpus[d])})")
    shared = f", shared by {workers} workers" if workers > 1 else ""
    where = f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({'; '.join(map(_free, gpus))}{shared})"
    return VramBudget(int(sum(g.free for g in gpus) * VRAM_SAFETY) // workers, len(gpus), where)


def needed(dims: ModelDims, kv_cells: int, slots: int, n_batch: int, gpu_share: float, gpus: int = 1) -> int:
    """VRAM one worker needs with `gpu_share` of its repeating layers there, this many KV cells,
    spread over `gpus` GPUs."""
    weights = dims.file_bytes * gpu_share
    output_layer = dims.n_vocab * dims.n_embd * 2 if 0 < gpu_share < 1 else 0
    kv = (kv_cells * dims.kv_bytes_per_cell + (slots + 1) * dims.state_bytes_per_seq) * gpu_share
    compute = n_batch * (dims.n_vocab * 4 + dims.n_embd * ACTIVATION_BYTES)
    return int(weights + output_layer + kv + compute) + gpus * CUDA_CONTEXT


def vram_fit(dims: ModelDims, kv_cells_for: Callable[[int], int], n_batch_for: Callable[[int], int],
             gpu_share: float, gpus: Sequence[GpuMemory],
             devices: Sequence[int]) -> Optional[Callable[[int, int], VramCheck]]:
    """For the memory plan: (workers, slots) -> what a worker needs and whether it fits; None
    when VRAM cannot be planned."""
    if budget(gpus, devices, 1) is None:
        return None

    def check(workers: int, slots: int) -> VramCheck:
        room = budget(gpus, devices, workers)
        assert room is not None  # the GPUs and devices are those checked above
        need = needed(dims, kv_cells_for(slots), slots, n_batch_for(slots), gpu_share, room.gpus_per_worker)
        return VramCheck(need, need <= room.per_worker, room.where)
    return check


def _free(gpu: GpuMemory) -> str:
    return f"{gpu.name}: {gpu.free / MIB:,.0f} MiB free"
