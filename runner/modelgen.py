"""Generate small random-weight llama GGUF models for tests, demos and benchmarks.

The weights are random, so the text a model writes is nonsense, but the files are real
llama-architecture GGUFs: llama.cpp loads them, tokenizes with a real tokenizer, applies
the chat template and runs the same kernels (at the same cost) as a trained model of the
same shape. That is all a batch runner needs to be tested and benchmarked without
downloading weights.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np

__all__ = [
    "ModelShape", "SHAPES", "Tokenizer", "build_demo_tokenizer", "tokenizer_from_vocab_gguf",
    "write_random_llama_gguf", "quantize", "make_model", "ensure_demo_model", "DEMO_MODEL_NAME",
]

# Bump when anything that changes the demo model's bytes changes, so caches never serve a stale file.
DEMO_MODEL_NAME = "demo-v1.gguf"
WEIGHT_STD = 0.02


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

_V = gguf.GGUFValueType
# Tokenizer attribute <-> GGUF key, with the value types llama.cpp expects (it checks them).
_TOKENIZER_KEYS: list[tuple[str, str, gguf.GGUFValueType, gguf.GGUFValueType | None]] = [
    ("model", "tokenizer.ggml.model", _V.STRING, None),
    ("pre", "tokenizer.ggml.pre", _V.STRING, None),
    ("tokens", "tokenizer.ggml.tokens", _V.ARRAY, _V.STRING),
    ("scores", "tokenizer.ggml.scores", _V.ARRAY, _V.FLOAT32),
    ("token_types", "tokenizer.ggml.token_type", _V.ARRAY, _V.INT32),
    ("merges", "tokenizer.ggml.merges", _V.ARRAY, _V.STRING),
    ("bos_id", "tokenizer.ggml.bos_token_id", _V.UINT32, None),
    ("eos_id", "tokenizer.ggml.eos_token_id", _V.UINT32, None),
    ("eot_id", "tokenizer.ggml.eot_token_id", _V.UINT32, None),
    ("unk_id", "tokenizer.ggml.unknown_token_id", _V.UINT32, None),
    ("pad_id", "tokenizer.ggml.padding_token_id", _V.UINT32, None),
    ("add_bos", "tokenizer.ggml.add_bos_token", _V.BOOL, None),
    ("add_eos", "tokenizer.ggml.add_eos_token", _V.BOOL, None),
    ("chat_template", "tokenizer.chat_template", _V.STRING, None),
]


@dataclass
class Tokenizer:
    """The ``tokenizer.*`` metadata of a GGUF; ``extra`` keeps other keys as (value, type, sub_type)."""

    model: str
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None
    pre: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    chat_template: str | None = None
    extra: dict[str, tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def add_to(self, writer: gguf.GGUFWriter) -> None:
        """Add every set field to ``writer`` as GGUF key/values, in a fixed order."""
        for attr, key, vtype, sub_type in _TOKENIZER_KEYS:
            value = getattr(self, attr)
            if value is not None:
                writer.add_key_value(key, value, vtype, sub_type)
        for key, (value, vtype, sub_type) in sorted(self.extra.items()):
            writer.add_key_value(key, value, vtype, sub_type)


def tokenizer_from_vocab_gguf(path: str | os.PathLike[str]) -> Tokenizer:
    """Read all ``tokenizer.*`` fields of a (vocab-only or full) GGUF, e.g. ggml-vocab-qwen2.gguf."""
    reader = gguf.GGUFReader(path)
    known = {key: attr for attr, key, _, _ in _TOKENIZER_KEYS}
    values: dict[str, Any] = {}
    extra: dict[str, tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]] = {}
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = fld.contents()
        if key in known:
            values[known[key]] = value
        else:
            is_array = fld.types[0] == _V.ARRAY
            extra[key] = (value, fld.types[0], fld.types[-1] if is_array else None)
    if "model" not in values or "tokens" not in values:
        raise ValueError(f"{path}: no tokenizer.ggml.model / tokenizer.ggml.tokens metadata")
    # A vocab without token types is legal GGUF but llama.cpp then treats all tokens as normal.
    values.setdefault("token_types", [int(gguf.TokenType.NORMAL)] * len(values["tokens"]))
    return Tokenizer(**values, extra=extra)


# A small English sample from which the demo vocabulary is learned (frequency ~ earlier = commoner).
_DEMO_CORPUS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how said "
    "an each she which do their time if will way about many then them write would like so these "
    "her long make thing see him two has look more day could go come did number sound no most "
    "people my over know water than call first who may down side been now find any new work part "
    "take get place made live where after back little only round man year came show every good "
    "me give our under name very through just form sentence great think say help low line before "
    "turn cause same mean differ move right boy old too does tell set three want air well also "
    "play small end put home read hand large spell add even land here must big high such follow "
    "act why ask men change went light kind off need house picture try us again animal point "
    "mother world near build self earth father Hello The What How Yes question answer model "
    "test batch file system user assistant once upon story"
)
_SPM_SPACE = "\u2581"  # SentencePiece's word-start marker "▁"
_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _learn_pieces(corpus: str, n_merges: int) -> list[str]:
    """Tiny deterministic BPE: the merged pieces, best first.

    llama.cpp's SPM tokenizer only reaches a piece through merges of two pieces that are
    themselves in the vocabulary, so whole words need their sub-pieces too; learning BPE
    merges gives exactly such chains.
    """
    words = corpus.split()
    freqs = {_SPM_SPACE + w: len(words) - i for i, w in enumerate(words)}
    splits = {w: list(w) for w in freqs}
    pieces: list[str] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, parts in splits.items():
            for pair in zip(parts, parts[1:]):
                pairs[pair] += freqs[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))  # ties broken by text: deterministic
        merged = best[0] + best[1]
        for w, parts in splits.items():
            i, out = 0, []
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            splits[w] = out
        if merged not in pieces:
            pieces.append(merged)
    return pieces


def build_demo_tokenizer(n_merges: int = 400) -> Tokenizer:
    """A llama (SentencePiece) tokenizer built here, with byte fallback and ChatML specials."""
    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]  # byte fallback: any text round-trips
    types += [tt.BYTE] * 256
    scores = [0.0] * len(tokens)
    chars = [_SPM_SPACE] + [chr(c) for c in range(33, 127)]
    merged = _learn_pieces(_DEMO_CORPUS, n_merges)
    # SPM merges the pair whose result scores highest: learned pieces by rank, single chars last.
    scores += [-1000.0 - i for i in range(len(chars))] + [-1.0 - i for i in range(len(merged))]
    tokens += chars + merged
    types += [tt.NORMAL] * (len(chars) + len(merged))
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [tt.CONTROL, tt.CONTROL]
    scores += [0.0, 0.0]
    return Tokenizer(
        model="llama", tokens=tokens, token_types=[int(t) for t in types], scores=scores,
        bos_id=1, eos_id=2, unk_id=0, eot_id=tokens.index("<|im_end|>"),
        add_bos=True, add_eos=False, chat_template=_CHATML_TEMPLATE,
    )


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


def _temp_sibling(path: Path) -> Path:
    """A fresh temp file next to ``path``, so os.replace onto it is atomic (same filesystem)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(name, 0o644)  # mkstemp makes it 0600; the model should be readable like any file
    return Path(name)


def write_random_llama_gguf(
    path: str | os.PathLike[str], shape: ModelShape, tokenizer: Tokenizer, seed: int = 0,
    ftype: str = "f16", name: str = "ggbatch-random-llama",
) -> Path:
    """Write a llama GGUF with N(0, WEIGHT_STD) weights and unit norms; byte-for-byte deterministic.

    Special and byte tokens get zero output rows (the token embedding rows when tied), so they
    are never the greedy choice.
    """
    if ftype not in ("f16", "f32"):
        raise ValueError(f"ftype must be 'f16' or 'f32', not {ftype!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wdtype = np.dtype(np.float16 if ftype == "f16" else np.float32)
    specs = _tensor_specs(shape, tokenizer.vocab_size)

    writer = gguf.GGUFWriter(None, "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if ftype == "f16" else gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(tokenizer.vocab_size)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_freq_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    tokenizer.add_to(writer)
    # Declare all tensors first, then stream them one at a time: a big model never sits in RAM.
    for tname, tshape in specs:
        dtype = np.dtype(np.float32) if len(tshape) == 1 else wdtype  # llama.cpp keeps norms in f32
        writer.add_tensor_info(tname, tshape, dtype, int(np.prod(tshape)) * dtype.itemsize)

    tmp = _temp_sibling(path)
    try:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        # Output rows of non-NORMAL tokens (control, byte, unknown) are zeroed: their logit is then
        # exactly 0, below the best of the many random ones, so greedy decoding writes words and
        # runs to max_tokens instead of stopping at a random EOS or emitting stray UTF-8 bytes.
        # Tied, the output rows are the embedding rows, so those are zeroed instead. Such a token
        # then enters the model as a zero vector, which is harmless: RMS norm maps it to zero (no
        # NaN), attention mixes in the other positions' values at the first layer, and only a
        # prompt made of nothing but special tokens would leave all logits at 0 (a chat prompt
        # always ends in text). The cost per token is unchanged, which is what these models are for.
        silent = np.asarray(tokenizer.token_types) != gguf.TokenType.NORMAL
        output_rows = "token_embd.weight" if shape.tied_embeddings else "output.weight"
        for tname, tshape in specs:
            if len(tshape) == 1:
                data = np.ones(tshape, dtype=np.float32)
            else:
                data = (rng.standard_normal(tshape, dtype=np.float32) * WEIGHT_STD).astype(wdtype)
                if tname == output_rows:
                    data[silent] = 0
            writer.write_tensor_data(data)
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


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
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, _QTYPES[key])
    params.nthread = nthread or 0  # 0: llama.cpp uses all hardware threads
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


def _named_shape(shape_name: str, tie_embeddings: bool | None) -> tuple[ModelShape, str]:
    """The shape and the model's ``general.name``; a tying that differs from the named shape's own
    is part of the name, so a file says what it holds."""
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r}; known shapes: {', '.join(SHAPES)}")
    shape = SHAPES[shape_name]
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
    tokenizer = build_demo_tokenizer() if vocab is None else tokenizer_from_vocab_gguf(vocab)
    out = Path(out)
    if quant is None:
        return write_random_llama_gguf(out, shape, tokenizer, seed, ftype, name=name)
    out.parent.mkdir(parents=True, exist_ok=True)
    unquantized = _temp_sibling(out)
    try:
        write_random_llama_gguf(unquantized, shape, tokenizer, seed, ftype, name=name)
        return quantize(unquantized, out, quant)
    finally:
        unquantized.unlink(missing_ok=True)


def ensure_demo_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of the cached demo model (built on first use) in ``$XDG_CACHE_HOME/ggbatch``."""
    if cache_dir is None:
        cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ggbatch"
    path = Path(cache_dir) / DEMO_MODEL_NAME
    # Writes are atomic, so an existing file is complete; racing builders each replace it whole.
    if not path.is_file():
        make_model(path, "demo", seed=0, ftype="f32")
    return path
