"""Whether a job's workers let llama.cpp repack the model's weights into its CPU_REPACK layout,
and why: the job's word, then `ggbatch tune`'s, then the CPU and the batch; never where the
result would change (batch_invariant, a hybrid model) or where this CPU refuses the repacked
kernels (runner/plan/repack_check.py). runner/plan/layout.py asks it when it lays the workers out.

The rule (repack_weights) is a pure function of what cpu_flags and model_is_hybrid read.
"""

from __future__ import annotations

from typing import Optional

from ..errors import KeysError
from ..model.gguf_header import GGUFFormatError, read_hparams
from .layers import hybrid_memory

# Sequences per worker from which llama.cpp's plain kernels beat its repacked ones on AVX-512.
PLAIN_KERNELS_FROM_SLOTS = 16


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (x86 "flags", ARM "Features"); empty if unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def model_is_hybrid(path: str) -> bool:
    """Whether the GGUF file at `path` has attention and recurrent layers (layers.hybrid_memory);
    False for a header that cannot be read (loading the model says why)."""
    try:
        return hybrid_memory(read_hparams(path))
    except (OSError, GGUFFormatError):
        return False


def repack_weights(requested: Optional[bool], tuned: Optional[bool], flags: frozenset[str],
                   slots: int, batch_invariant: bool = False, hybrid: bool = False,
                   refused: str = "", nothing_to_repack: bool = False) -> tuple[bool, str]:
    """Whether workers let llama.cpp repack the weights into its CPU_REPACK layout, and why;
    `slots`: the sequences each worker is expected to decode together.

    Never under batch_invariant: the repacked kernels compute each group of 4 batch rows with
    gemm and the rest with gemv, which round differently (llama.cpp repack.cpp
    forward_mul_mat_one_chunk), so a row's result would depend on the batch.

    llama.cpp repacks by default, for its interleaved gemm kernels. On an x86 CPU with AVX-512 its
    plain kernels win from about 16 sequences a batch, measured here (AMD EPYC, 28 × 1024 Q4_K_M,
    llama-batched-bench with and without --no-repack): prompts 1.5× faster at every batch size;
    generation 143 → 126 tok/s at 8 sequences, 225 → 216 at 16, 255 → 318 at 32; whole runs of
    32-token prompts and 256 generated tokens 12% slower at 8, even at 16, 26% faster at 32
    (128-token prompts and 64 generated: 8% faster at 8, 1.3× at 32). Not repacking also loads
    faster (0.30 s against 0.43 s) and keeps the weights in the shared file pages (161 MiB less
    per worker). Elsewhere (ARM, where llama.cpp reports 2-3.5× faster prompts repacked; AVX2)
    llama.cpp's default stays until `ggbatch tune`, which tries both, says otherwise.

    Never on a hybrid model (attention and recurrent layers: LFM2, Qwen3.5): with the weights
    repacked, llama.cpp (0.3.36's) mixes the sequences of a batch on these models, and answers
    differ from each prompt decoded alone from the first token (tests/test_model_families.py).

    Never where this CPU refuses llama.cpp's repacked kernels (`refused` says why:
    runner/plan/repack_check.py). Plain where the file has nothing llama.cpp repacks here
    (`nothing_to_repack`: runner/plan/repack_share.py), whatever is asked: the plan and the
    layout line then count and say no copy."""
    if batch_invariant:
        if requested:
            raise KeysError("model.repack: true cannot be combined with batch_invariant: llama.cpp's "
                            "repacked kernels give a row another result in another batch",
                            ("model.repack", "batch_invariant"))
        return False, "batch_invariant"
    if nothing_to_repack:
        return False, "nothing to repack"
    wanted, why = _wanted(requested, tuned, flags, slots)
    if not wanted:
        return False, why
    if hybrid:  # the model, then the CPU: either way plain, the reason said
        if requested:
            raise KeysError("model.repack: true cannot be used with this hybrid model (attention and recurrent "
                            "layers): llama.cpp's repacked kernels mix the sequences of a batch on it",
                            ("model.repack",))
        return False, "hybrid model: repacked kernels mix its sequences"
    if refused:
        if requested:
            raise KeysError(f"model.repack: true: {refused}; leave it auto or false", ("model.repack",))
        return False, refused
    return True, why


def _wanted(requested: Optional[bool], tuned: Optional[bool], flags: frozenset[str], slots: int) -> tuple[bool, str]:
    """What the job, then `ggbatch tune`, then the CPU and the batch ask for (repack_weights)."""
    if requested is not None:
        return requested, "job"
    if tuned is not None:
        return tuned, "ggbatch tune"
    if "avx512f" in flags and slots >= PLAIN_KERNELS_FROM_SLOTS:
        return False, f"auto: AVX-512 CPU, {PLAIN_KERNELS_FROM_SLOTS}+ sequences per worker"
    return True, "auto: llama.cpp default"
