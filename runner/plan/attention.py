"""Flash attention on auto, and what a step's attention writes without it.

llama.cpp's own auto turns flash attention on wherever its kernel runs, a CPU included. On a CPU
its kernel decodes several times slower than the plain path, which multiplies each sequence's
query by its cells as matrices; it computes a prompt step faster, more so deep into a long
context. `python bench/attention_bench.py` on the 28 × 1024 benchmark model, 2 threads (AVX-512):

    512 prompt tokens after   0 / 1,000 / 3,000:   294 / 180 / 119 tokens/s on, 229 / 173 / 86 off
    a step of 32 sequences at 100 / 1,000 / 3,000:  252 / 1,477 / 4,065 ms on,   240 / 383 / 831 off

A whole job is mostly decode steps: W1 (32 questions, 64 tokens) took 63.4 s on and 51.0 s off,
few-shot W2 134.0 and 91.1 s, LSAT's passages 147.9 and 102.6 s (bench/compare_server.py's
workloads, one sitting). So on auto a worker with no layer on a GPU runs without it, up to
CPU_MAX_CONTEXT tokens a sequence. Past that, a prompt step's attention scores (below) grow large
and long prompts gain most from the kernel, so llama.cpp's choice stands, as it does wherever
layers sit on a GPU, whose kernels are fast.

Without flash attention a prompt step writes its attention scores: for each of its n_batch
tokens and each head, an f32 score for every cell its sequence's stream holds, then their
softmax. The memory plan counts them (runner/plan/memory.py): 2 slots of 3,444-token prompts on
the benchmark model planned 1,255 MiB against 1,257 MiB of PSS.
"""

from __future__ import annotations

from typing import Optional

from ..config.checks import AUTO

CPU_MAX_CONTEXT = 4096
# f32 scores; PSS grew by 1.28 times their bytes (the softmax, the mask: 2 slots of 3,444 tokens,
# 143 MiB over the same job with flash attention), counted with some room: 1.5 times
SCORE_BYTES = 6


def flash_attn_for(asked: Optional[bool], n_gpu_layers: int, n_ctx_seq: int) -> bool:
    """Whether the workers run flash attention: as asked, or on auto off on a CPU (no layer on a
    GPU) for contexts up to CPU_MAX_CONTEXT tokens a sequence, else llama.cpp's choice (True
    here: the workers then leave it to llama.cpp)."""
    if asked is not AUTO:
        return bool(asked)
    return bool(n_gpu_layers) or n_ctx_seq > CPU_MAX_CONTEXT


def attention_scores_bytes(n_batch: int, scored_cells: int, n_head: int) -> int:
    """What one prompt step without flash attention writes: n_batch tokens × the cells their
    stream holds (`scored_cells`; 0 with flash attention) × heads, with their softmax."""
    return n_batch * scored_cells * n_head * SCORE_BYTES
