"""The memory plan's VRAM side: what a worker's layers on a GPU need there, and what the GPUs
have free (the tokenizer process reads it from llama.cpp: workers/llama/gpu_memory.py). Pure
arithmetic, like runner/plan/memory.py, whose fit_layout shrinks slots until both fit.

A worker with layers on a GPU holds there:
- their weights: the GGUF file's share of them (the input embedding stays in RAM: counted
  anyway, a margin);
- their KV cache: the same cells and bytes per cell as the RAM plan counts;
- llama.cpp's compute buffer on the device, which holds a step's logits (n_batch rows of n_vocab
  floats at most: llama.cpp sizes it for a whole step of outputs) and activations, and the
  process's own CUDA context and library workspaces (CUDA_CONTEXT).

With `devices` each worker has one GPU of its own: every one of them must hold a worker. Without,
one worker's layers are split by llama.cpp over every GPU it sees: their free memory adds up.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from ...workers.protocol import GpuMemory
from .memory import MIB, ModelDims

CUDA_CONTEXT = 512 * MIB  # a process's CUDA context, cuBLAS and flash-attention workspaces
ACTIVATION_BYTES = 80  # per token of a step and embedding value, as runner/plan/memory.py counts them
VRAM_SAFETY = 0.9  # of the free memory: other processes, fragmentation


def needed(dims: ModelDims, kv_cells: int, slots: int, n_batch: int, gpu_share: float) -> int:
    """VRAM one worker needs with `gpu_share` of its layers there and this many KV cells."""
    weights = dims.file_bytes * gpu_share
    kv = (kv_cells * dims.kv_bytes_per_cell + (slots + 1) * dims.state_bytes_per_seq) * gpu_share
    compute = n_batch * (dims.n_vocab * 4 + dims.n_embd * ACTIVATION_BYTES)
    return int(weights + kv + compute) + CUDA_CONTEXT


def free_for(gpus: Sequence[GpuMemory], devices: Sequence[int]) -> Optional[tuple[int, str]]:
    """The VRAM one worker may plan for, and where: the smallest free memory among the given
    devices (one worker each), or all the GPUs' together (one worker splitting its layers over
    them). None: no GPU known (then VRAM is llama.cpp's to fit, unplanned)."""
    if not gpus or any(d >= len(gpus) for d in devices):
        return None
    if devices:
        d = min(devices, key=lambda i: gpus[i].free)
        return int(gpus[d].free * VRAM_SAFETY), f"GPU {d} ({gpus[d].name}: {gpus[d].free / MIB:,.0f} MiB free)"
    names = ", ".join(f"{g.name}: {g.free / MIB:,.0f} MiB free" for g in gpus)
    return int(sum(g.free for g in gpus) * VRAM_SAFETY), f"{len(gpus)} GPU(s) ({names})"


def vram_fit(dims: ModelDims, kv_cells_for: Callable[[int], int], n_batch_for: Callable[[int], int],
             gpu_share: float, budget: int) -> Callable[[int], tuple[int, bool]]:
    """For the memory plan: slots -> (VRAM a worker needs with that many slots, whether it fits)."""
    def fit(slots: int) -> tuple[int, bool]:
        need = needed(dims, kv_cells_for(slots), slots, n_batch_for(slots), gpu_share)
        return need, need <= budget
    return fit
