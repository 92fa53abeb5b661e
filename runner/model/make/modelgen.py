"""Generate small random-weight GGUF models for tests, demos and benchmarks.

The weights are random, so the text a model writes is nonsense, but the files are real
GGUFs of the architectures users run: llama.cpp loads them, tokenizes with a real tokenizer, applies
the chat template and runs the same kernels (at the same cost) as a trained model of the
same shape. That is all a batch runner needs to be tested and benchmarked without
downloading weights.

Each architecture's shape is a module of its own (llama_gen.py, qwen3_gen.py, gemma3_gen.py,
mamba2_gen.py, lfm2_gen.py, qwen35_gen.py) on one base (shape.py), written by one writer
(gguf_random.py).
"""

from __future__ import annotations

import logging
import os
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from ...errors import OutputError
from ...files.paths import check_output, ggbatch_cache, same_file, same_file_error
from .gemma3_gen import Gemma3Shape
from .gguf_random import temp_sibling as _temp_sibling
from .gguf_random import write_random_gguf
from .gguf_vocab import GGUFVocab, build_demo_vocab, vocab_from_gguf
from .lfm2_gen import Lfm2Shape
from .llama_gen import LlamaShape
from .mamba2_gen import Mamba2Shape
from .qwen3_gen import Qwen3MoeShape, Qwen3Shape
from .qwen35_gen import Qwen35Shape
from .reasoning_vocab import with_reasoning
from .shape import Shape

__all__ = [
    "ModelShape", "Shape", "SHAPES", "ARCH_SHAPES", "GGUFVocab", "build_demo_vocab", "vocab_from_gguf",
    "write_model_gguf", "write_random_llama_gguf", "quantize", "make_model", "ensure_demo_model", "DEMO_MODEL_NAME",
]

# Bump when anything that changes the demo model's bytes changes, so caches never serve a stale file.
DEMO_MODEL_NAME = "demo-v1.gguf"

ModelShape = LlamaShape  # the name callers know the llama shape by

SHAPES: dict[str, LlamaShape] = {
    "demo": LlamaShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=192, n_ctx=2048),
    "bench-28x1024": LlamaShape(n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, n_ff=3072, n_ctx=4096),
    # "like" Qwen3: same layer/width/FFN/context and, as the real ones, the output layer tied to the
    # token embeddings; but a llama (head_dim = n_embd / n_head and no q/k norms: qwen3-tiny has them).
    "qwen3-0.6b-like": LlamaShape(n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, n_ff=3072, n_ctx=40960,
                                  rope_freq_base=1e6, rms_eps=1e-6, tied_embeddings=True),
    "qwen3-1.7b-like": LlamaShape(n_layer=28, n_embd=2048, n_head=16, n_head_kv=8, n_ff=6144, n_ctx=40960,
                                  rope_freq_base=1e6, rms_eps=1e-6, tied_embeddings=True),
}

# Tiny models of the other architectures users run, for tests: their memory is not (only) an
# attention KV cache that can be cut anywhere (workers/engine/memory_kind.py), or their weights are not
# all used by every token. The attention ones untied: tied, with a residual stream that is mostly
# the token's own embedding, they repeat their last token whatever came before.
ARCH_SHAPES: dict[str, Shape] = {
    "qwen3-tiny": Qwen3Shape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                             head_dim_override=32, tied_embeddings=False),
    "qwen3moe-tiny": Qwen3MoeShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                                   head_dim_override=32, n_expert=8, n_expert_used=2, n_ff_exp=32,
                                   tied_embeddings=False),
    # local, global; a window of 16 positions, which the tests' prompts go past
    "gemma3-tiny": Gemma3Shape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                               head_dim_override=32, sliding_window=16, swa_pattern=2, tied_embeddings=False),
    "mamba2-tiny": Mamba2Shape(n_layer=2, n_embd=64, d_state=16, head_dim=16, n_ctx=2048),
    # convolution, attention, convolution, attention
    "lfm2-tiny": Lfm2Shape(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                           attention_layers=(1, 3)),
    # DeltaNet, DeltaNet, DeltaNet, attention (Qwen3.5's 3:1)
    "qwen35-tiny": Qwen35Shape(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                               d_state=16, n_k_heads=2, n_v_heads=4),
}


def write_model_gguf(path: str | os.PathLike[str], shape: Shape, vocab: GGUFVocab, seed: int = 0,
                     ftype: str = "f16", name: str = "") -> Path:
    """A random-weight GGUF of the shape's architecture, byte-for-byte deterministic for a seed
    (name: general.name, default ggbatch-random-<arch>).

    Special and byte tokens get zero output rows (the token embedding rows when tied), so they
    are never the greedy choice."""
    return write_random_gguf(path, shape.arch, shape.tensor_specs(vocab.vocab_size), shape.add_hyperparameters,
                             vocab, seed, ftype, name or f"ggbatch-random-{shape.arch}", shape.output_rows,
                             shape.fill, shape.weight_std)


write_random_llama_gguf = write_model_gguf  # the name the llama callers use


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


def _named_shape(shape_name: str, tie_embeddings: bool | None) -> tuple[Shape, str]:
    """The shape and the model's ``general.name``; a tying that differs from the named shape's own
    is part of the name, so a file says what it holds."""
    shapes: dict[str, Shape] = {**SHAPES, **ARCH_SHAPES}
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
    reasoning: str | None = None,
) -> Path:
    """Build a random model of a named shape; ``vocab``: GGUF to take the tokenizer from (None: demo);
    ``tie_embeddings``: override the shape's own tying (None keeps it); ``reasoning``: think or
    harmony, the demo vocabulary of a reasoning model (reasoning_vocab.py)."""
    _named_shape(shape_name, tie_embeddings)  # a bad name is refused before the output is touched
    if quant is not None and quant.lower() not in _QTYPES:
        raise ValueError(f"unknown quantization type {quant!r}; known: {', '.join(_QTYPES)}")
    target = checked_output(out, vocab)
    try:
        _build(target, shape_name, vocab, quant, seed, ftype, tie_embeddings, reasoning)
    except OSError as exc:  # past the checks: a disk that filled, a folder removed meanwhile
        raise OutputError(f"{out}: could not write the model: {exc.strerror or exc}") from None
    return Path(out)


def checked_output(out: str | os.PathLike[str], vocab: str | os.PathLike[str] | None) -> Path:
    """The file to write for ``out``, refused before any work if it cannot or must not be written:
    a stream or device (/dev/stdout), a directory, an unwritable folder, or the --vocab file itself.
    A symlink is written through (its target replaced, the link kept), as the answers file is."""
    with suppress(OSError):  # make-model makes the folder; one it cannot make check_writable names
        Path(out).resolve().parent.mkdir(parents=True, exist_ok=True)
    check_output(str(out), "the model")  # not a stream or device, not a journal, writable
    if vocab is not None and same_file(str(out), str(vocab)):
        raise same_file_error("the vocab file (--vocab)", "the model", str(out))
    return Path(os.path.realpath(out))


def _build(
    out: Path, shape_name: str, vocab: str | os.PathLike[str] | None, quant: str | None, seed: int,
    ftype: str, tie_embeddings: bool | None, reasoning: str | None,
) -> Path:
    """make_model's work on a path already checked (or ggbatch's own, the demo model's)."""
    shape, name = _named_shape(shape_name, tie_embeddings)
    gguf_vocab = build_demo_vocab() if vocab is None else vocab_from_gguf(vocab)
    if reasoning is not None:
        if vocab is not None:
            raise ValueError("--reasoning builds on the demo vocabulary: give it without --vocab")
        gguf_vocab, name = with_reasoning(gguf_vocab, reasoning), f"{name}-{reasoning}"

    def write(path: Path) -> Path:
        return write_model_gguf(path, shape, gguf_vocab, seed, ftype, name=name)

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
        _build(path, "demo", None, None, 0, "f32", None, None)
    return path
