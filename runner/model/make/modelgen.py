"""Generate small random-weight GGUF models for tests, demos and benchmarks.

The weights are random, so the text a model writes is nonsense, but the files are real
llama-architecture GGUFs: llama.cpp loads them, tokenizes with a real tokenizer, applies
the chat template and runs the same kernels (at the same cost) as a trained model of the
same shape. That is all a batch runner needs to be tested and benchmarked without
downloading weights.

Llama shapes are written here; other architectures (ARCH_SHAPES: recurrent and hybrid memory)
by a module each (mamba2_gen.py, lfm2_gen.py) through the same writer (gguf_random.py).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Union

import gguf

from ...files.paths import ggbatch_cache
from .gguf_random import temp_sibling as _temp_sibling
from .gguf_random import write_random_gguf
from .gguf_vocab import GGUFVocab, build_demo_vocab, vocab_from_gguf
from .lfm2_gen import Lfm2Shape
from .mamba2_gen import Mamba2Shape

__all__ = [
    "ModelShape", "SHAPES", "ARCH_SHAPES", "GGUFVocab", "build_demo_vocab", "vocab_from_gguf",
    "write_random_llama_gguf", "write_arch_gguf", "quantize", "make_model", "ensure_demo_model", "DEMO_MODEL_NAME",
]

# Bump when anything that changes the demo model's bytes changes, so caches never serve a stale file.
DEMO_MODEL_NAME = "demo-v1.gguf"


@dataclass(frozen=True)
class ModelShape:
    """Hyper-parameters of a llama-architecture model (head_dim = n_embd // n_head).

    ``tied_embeddings``: no ``output.weight``; llama.cpp's llama architecture then computes the
    logits with ``token_embd.weight``, as small models that share the two matrices do.
    """

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"n_embd must divide by n_head and n_head by n_head_kv: {self}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


SHAPES: dict[str, ModelShape] = {
    "demo": ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=192, n_ctx=2048),
    "bench-28x1024": ModelShape(n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, n_ff=3072, n_ctx=4096),
    # "like" Qwen3: same layer/width/FFN/context and, as the real ones, the output layer tied to the
    # token embeddings; but head_dim = n_embd / n_head and no q/k norms.
    "qwen3-0.6b-like": ModelShape(28, 1024, 16, 8, 3072, 40960, rope_freq_base=1e6, rms_eps=1e-6,
                                  tied_embeddings=True),
    "qwen3-1.7b-like": ModelShape(28, 2048, 16, 8, 6144, 40960, rope_freq_base=1e6, rms_eps=1e-6,
                                  tied_embeddings=True),
}

ArchShape = Union[Mamba2Shape, Lfm2Shape]
# Tiny models of the architectures whose memory is not (only) an attention KV cache: a recurrent
# state per sequence that llama.cpp cannot cut back to a position (workers/engine/memory_kind.py).
ARCH_SHAPES: dict[str, ArchShape] = {
    "mamba2-tiny": Mamba2Shape(n_layer=2, n_embd=64, d_state=16, head_dim=16, n_ctx=2048),
    # convolution, attention, convolution, attention
    "lfm2-tiny": Lfm2Shape(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                           attention_layers=(1, 3)),
}

def _tensor_specs(shape: ModelShape, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """llama tensor names with numpy shapes (numpy order is the reverse of ggml's ne)."""
    e, kv = shape.n_embd, shape.n_head_kv * shape.head_dim
    specs: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, e))]
    for i in range(shape.n_layer):
        specs += [
            (f"blk.{i}.attn_norm.weight", (e,)),
            (f"blk.{i}.attn_q.weight", (e, e)),
            (f"blk.{i}.attn_k.weight", (kv, e)),
            (f"blk.{i}.attn_v.weight", (kv, e)),
            (f"blk.{i}.attn_output.weight", (e, e)),
            (f"blk.{i}.ffn_norm.weight", (e,)),
            (f"blk.{i}.ffn_gate.weight", (shape.n_ff, e)),
            (f"blk.{i}.ffn_up.weight", (shape.n_ff, e)),
            (f"blk.{i}.ffn_down.weight", (e, shape.n_ff)),
        ]
    specs.append(("output_norm.weight", (e,)))
    if not shape.tied_embeddings:
        specs.append(("output.weight", (n_vocab, e)))
    return specs


def write_random_llama_gguf(
    path: str | os.PathLike[str], shape: ModelShape, vocab: GGUFVocab, seed: int = 0,
    ftype: str = "f16", name: str = "ggbatch-random-llama",
) -> Path:
    """Write a llama GGUF with N(0, WEIGHT_STD) weights and unit norms; byte-for-byte deterministic.

    Special and byte tokens get zero output rows (the token embedding rows when tied), so they
    are never the greedy choice."""
    output_rows = "token_embd.weight" if shape.tied_embeddings else "output.weight"
    return write_random_gguf(path, "llama", _tensor_specs(shape, vocab.vocab_size),
                             lambda writer: _add_hyperparameters(writer, shape), vocab, seed, ftype, name,
                             output_rows)


def write_arch_gguf(path: str | os.PathLike[str], shape: ArchShape, vocab: GGUFVocab, seed: int = 0,
                    ftype: str = "f16", name: str = "ggbatch-random") -> Path:
    """Write a random-weight GGUF of another architecture (ARCH_SHAPES), as its module says."""
    output_rows = "token_embd.weight" if shape.tied_embeddings else "output.weight"
    return write_random_gguf(path, shape.arch, shape.tensor_specs(vocab.vocab_size), shape.add_hyperparameters,
                             vocab, seed, ftype, name, output_rows, shape.fill, shape.weight_std)


def _add_hyperparameters(writer: gguf.GGUFWriter, shape: ModelShape) -> None:
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_freq_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)


# Quantization names (as in llama-quantize) -> llama_cpp constant names.
_QTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32", "f16": "LLAMA_FTYPE_MOSTLY_F16", "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    **{q: f"LLAMA_FTYPE_MOSTLY_{q.upper()}" for q in (
        "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l",
        "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k")},
}


def quantize(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], qtype: str = "q4_k_m",
    nthread: int | None = None, verbose: bool = False,
) -> Path:
    """Quantize a GGUF with llama.cpp's own quantizer (k-quants fall back for rows not a multiple of 256).

    llama.cpp logs a line per tensor; unless ``verbose``, only errors are shown.
    """
    key = qtype.lower()
    if key not in _QTYPES:
        raise ValueError(f"unknown quantization type {qtype!r}; known: {', '.join(_QTYPES)}")
    import llama_cpp  # lazy: the native library is only needed here

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    from ....workers.llama.model_runner import set_fields

    params = llama_cpp.llama_model_quantize_default_params()
    # nthread 0: llama.cpp uses all hardware threads
    set_fields(params, ftype=getattr(llama_cpp, _QTYPES[key]), nthread=nthread or 0)
    # llama-cpp-python prints llama.cpp's log through this logger's level (it is what verbose= sets).
    log = logging.getLogger("llama-cpp-python")
    saved_level = log.level
    log.setLevel(logging.DEBUG if verbose else logging.ERROR)
    tmp = _temp_sibling(dst)
    try:
        rc = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(tmp), params)
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({src} -> {qtype}) failed with code {rc}")
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        log.setLevel(saved_level)
    return dst


def _named_shape(shape_name: str, tie_embeddings: bool | None) -> tuple[ModelShape | ArchShape, str]:
    """The shape and the model's ``general.name``; a tying that differs from the named shape's own
    is part of the name, so a file says what it holds."""
    shapes: dict[str, ModelShape | ArchShape] = {**SHAPES, **ARCH_SHAPES}
    if shape_name not in shapes:
        raise ValueError(f"unknown shape {shape_name!r}; known shapes: {', '.join(shapes)}")
    shape = shapes[shape_name]
    name = f"ggbatch-random-{shape_name}"
    if tie_embeddings is None or tie_embeddings == shape.tied_embeddings:
        return shape, name
    return replace(shape, tied_embeddings=tie_embeddings), name + ("-tied" if tie_embeddings else "-untied")


def make_model(
    out: str | os.PathLike[str], shape_name: str, vocab: str | os.PathLike[str] | None = None,
    quant: str | None = None, seed: int = 0, ftype: str = "f16", tie_embeddings: bool | None = None,
) -> Path:
    """Build a random model of a named shape; ``vocab``: GGUF to take the tokenizer from (None: demo);
    ``tie_embeddings``: override the shape's own tying (None keeps it)."""
    shape, name = _named_shape(shape_name, tie_embeddings)
    if quant is not None and quant.lower() not in _QTYPES:
        raise ValueError(f"unknown quantization type {quant!r}; known: {', '.join(_QTYPES)}")
    gguf_vocab = build_demo_vocab() if vocab is None else vocab_from_gguf(vocab)
    out = Path(out)

    def write(path: Path) -> Path:
        if isinstance(shape, ModelShape):
            return write_random_llama_gguf(path, shape, gguf_vocab, seed, ftype, name=name)
        return write_arch_gguf(path, shape, gguf_vocab, seed, ftype, name=name)

    if quant is None:
        return write(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    unquantized = _temp_sibling(out)
    try:
        write(unquantized)
        return quantize(unquantized, out, quant)
    finally:
        unquantized.unlink(missing_ok=True)


def ensure_demo_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of the cached demo model (built on first use) in ggbatch's cache folder."""
    path = Path(cache_dir or ggbatch_cache()) / DEMO_MODEL_NAME
    # Writes are atomic, so an existing file is complete; racing builders each replace it whole.
    if not path.is_file():
        make_model(path, "demo", seed=0, ftype="f32")
    return path
