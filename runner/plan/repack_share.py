"""How much of a model llama.cpp copies into its repacked layouts (the CPU_REPACK buffer, and AMX's
on Intel CPUs that list it), read from the GGUF tensor table: each worker holds that copy
privately, on top of the file's shared pages (runner/plan/memory.py).

llama.cpp (ggml-cpu repack.cpp, ggml_repack_get_optimal_repack_type and supports_op) repacks a
weight when a matrix multiplication takes it (MUL_MAT, 2-D; an expert tensor's MUL_MAT_ID, 3-D),
its type has an interleaved kernel for the CPU, and its rows come in multiples of the
interleave (4 or 8). token_embd is read by row (GET_ROWS), never repacked; norms and biases are
1-D. Measured with llama-cpp-python 0.3.36 on an AVX2 x86 CPU: Q4_0 and Q4_K matrices repacked,
Q8_0 and Q6_K not, f16/f32 nothing; a Q4_0 MoE 97% of its file (its experts). On an AVX-512 x86
CPU (AMD EPYC) Q2_K too, and the bytes planned here equal llama.cpp's CPU_REPACK buffer for
Q2_K, Q3_K_M, Q4_0, Q4_1, Q4_K_M, Q5_K_M and Q8_0 models of Qwen3-0.6B's shape.

Approximate: the type sets follow llama.cpp's source per CPU family, not the build's own answer;
on ARM, Q8_0, Q5_K and Q6_K are counted too (newer llama.cpp repacks them there), and where the
CPU is unknown every type any of them takes, so that the plan errs towards too much memory.
"""

from __future__ import annotations

from ..model.gguf_header import GGUFFormatError, GGUFLayout, TensorInfo, read_layout
from ..model.hub import model_parts

Q4_0, Q4_1, Q8_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS = 2, 3, 8, 10, 12, 13, 14, 20, 23  # ggml_type
X86_TYPES = frozenset({Q4_0, Q4_K, IQ4_NL})  # AVX2, 8 rows interleaved
X86_AVX512_TYPES = frozenset({Q2_K})
ARM_TYPES = frozenset({Q4_0, Q4_K, IQ4_NL, Q8_0, Q5_K, Q6_K})  # NEON dotprod / i8mm, 4 rows
AMX_TYPES = frozenset({Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS})  # ggml-cpu amx qtype_has_amx_kernels
NOT_BY_ROWS = ("token_embd", "per_layer_token_embd")  # read by GET_ROWS, never multiplied whole


def repacked_types(flags: frozenset[str]) -> tuple[frozenset[int], int]:
    """(the ggml types llama.cpp repacks on a CPU with these flags, the rows they interleave)."""
    types: frozenset[int] = frozenset()
    if "avx2" in flags:
        types |= X86_TYPES | (X86_AVX512_TYPES if "avx512f" in flags else frozenset())
    if "asimd" in flags:
        return types | ARM_TYPES, 4
    if "amx_int8" in flags:
        types |= AMX_TYPES
    if not flags:  # unknown CPU: whatever any of them takes
        return X86_TYPES | X86_AVX512_TYPES | ARM_TYPES | AMX_TYPES, 4
    return types, 8


def _repacked(tensor: TensorInfo, types: frozenset[int], rows: int) -> bool:
    if tensor.ggml_type not in types or len(tensor.dims) not in (2, 3) or tensor.name.startswith(NOT_BY_ROWS):
        return False
    return tensor.dims[1] % rows == 0


def layout_repacked_bytes(layout: GGUFLayout, flags: frozenset[str]) -> int:
    """The bytes of one GGUF file's tensors llama.cpp repacks on this CPU."""
    types, rows = repacked_types(flags)
    return sum(size for tensor, size in zip(layout.tensors, layout.tensor_bytes()) if _repacked(tensor, types, rows))


def repacked_bytes(path: str, flags: frozenset[str]) -> int | None:
    """The bytes of the model at `path` (every part of a split GGUF) llama.cpp repacks on this
    CPU; None when a header cannot be read (loading the model says why)."""
    try:
        return sum(layout_repacked_bytes(read_layout(part), flags) for part in model_parts(path))
    except (OSError, GGUFFormatError):
        return None


def nothing_to_repack(path: str, flags: frozenset[str]) -> bool:
    """Whether llama.cpp would repack none of the model's tensors here (an f16, bf16 or f32 file;
    Q8_0 on an AVX2 CPU): its weights are plain whatever the setting."""
    return repacked_bytes(path, flags) == 0
