"""The model, its context and the decode, through llama-cpp-python's low-level bindings (with
workers/llama/sampling.py, which chooses tokens from the logits, one of the few modules that touch
llama.cpp: docs/contributing.md lists them).

`ModelRunner` owns one model, one context holding many sequences and one reusable batch; the
engine above it speaks in plain ints and never sees a ctypes object. `Tokenizer` loads only the
vocabulary, for the tokenizer process (workers/tokenizer/process.py), which tokenizes every
prompt once for the coordinator.

llama.cpp reports why a load failed only in its log: its handler keeps the last error lines
(workers/llama/llama_log.py), and a failed load turns them into ModelLoadError's one line
(workers/llama/load_errors.py).
"""

from __future__ import annotations

import ctypes
from array import array
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import llama_cpp
import numpy as np

from ..engine.constraints import choice_spellings
from ..engine.memory_kind import MemoryKind
from ..helper_messages import VocabInfo
from . import llama_log
from .load_errors import ModelLoadError, describe_context_failure, describe_load_failure
from .vocab_gaps import SpmGaps


def set_fields(struct: ctypes.Structure, **values: Any) -> None:
    """Set fields of a llama.cpp params struct by name, refusing names it does not have. A ctypes
    Structure silently takes any attribute, so a field renamed in the bindings would otherwise be
    dropped without a word (llama-cpp-python replaced `use_mmap` by `load_mode`, and setting
    `use_mmap` went on working and doing nothing)."""
    known = {field[0] for field in type(struct)._fields_}
    unknown = sorted(set(values) - known)
    if unknown:
        raise AttributeError(f"{type(struct).__name__} has no field {', '.join(unknown)} "
                             "(the llama-cpp-python bindings changed?)")
    for name, value in values.items():
        setattr(struct, name, value)


@dataclass(frozen=True)
class Offload:
    """What llama.cpp was given about the GPU, and what it did."""

    n_gpu_layers: int  # layers to store in VRAM, as set in the model params (negative: all)
    gpu_layers: int  # layers llama.cpp says it offloaded; 0 on a build without GPU offload


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build has a GPU backend (CUDA, Metal, HIP, Vulkan, ...)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def model_params(vocab_only: bool, repack: bool = True, n_gpu_layers: int = 0,
                 one_device: bool = False) -> llama_cpp.llama_model_params:
    """repack: let llama.cpp copy the weights it can into its CPU_REPACK buffer, in the interleaved
    layout of its gemm kernels. Which is faster depends on the CPU and the batch: the coordinator
    decides (runner/plan/repack.py repack_weights). n_gpu_layers: layers stored in VRAM (negative: all;
    llama.cpp's own default is all, so 0 is set explicitly); one_device: the worker sees one GPU
    (workers/devices.py) and puts the whole model on it rather than splitting it by layer."""
    params: llama_cpp.llama_model_params = llama_cpp.llama_model_default_params()
    # mmap: the file's pages are the page cache's, shared by every worker (the memory plan counts
    # them once); only repacked weights are private.
    set_fields(params, vocab_only=vocab_only, load_mode=llama_cpp.LLAMA_LOAD_MODE_MMAP,
               use_extra_bufts=repack and not vocab_only, n_gpu_layers=0 if vocab_only else n_gpu_layers)
    if one_device:
        set_fields(params, split_mode=llama_cpp.LLAMA_SPLIT_MODE_NONE, main_gpu=0)
    return params


def _load_model(path: str, params: llama_cpp.llama_model_params) -> llama_cpp.llama_model_p:
    llama_log.init_backend()
    llama_log.errors.clear()
    llama_log.offloaded.clear()
    model: llama_cpp.llama_model_p = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise ModelLoadError(describe_load_failure(path, list(llama_log.errors), llama_cpp.__version__))
    return model


_preloaded: dict[tuple[str, bool], llama_cpp.llama_model_p] = {}


def preload_model(path: str, repack: bool, n_gpu_layers: int = 0, one_device: bool = False) -> Offload:
    """Load a model before its context settings are known; the next ModelRunner for the same path
    and repack setting takes it over. Returns what llama.cpp was given and did about the GPU."""
    params = model_params(False, repack, n_gpu_layers, one_device)
    _preloaded[(path, repack)] = _load_model(path, params)
    return Offload(params.n_gpu_layers, llama_log.offloaded[-1] if llama_log.offloaded else 0)


class _Vocab:
    """Token <-> text for a loaded model; pieces are cached because detokenizing is per token."""

    def __init__(self, model: llama_cpp.llama_model_p) -> None:
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_tokens = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self._pieces: dict[int, bytes] = {}
        self._buf = ctypes.create_string_buffer(256)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> array[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        out = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), out, capacity, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            out = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), out, capacity, add_special, parse_special)
        return array("i", out[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        key = token if not special else -token - 1
        cached = self._pieces.get(key)
        if cached is None:
            n = llama_cpp.llama_token_to_piece(self.vocab, token, self._buf, len(self._buf), 0, special)
            cached = self._buf.raw[:n] if n > 0 else b""
            self._pieces[key] = cached
        return cached

    def tokens_spelling(self, texts: set[bytes]) -> dict[bytes, list[int]]:
        """{text: the tokens whose text it is} for the given texts, by one pass over the vocabulary
        (not through the piece cache: most of the vocabulary is never generated)."""
        found: dict[bytes, list[int]] = {}
        longest = max(map(len, texts), default=0)
        buf = ctypes.create_string_buffer(max(64, longest + 1))
        for token in range(self.n_tokens):
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if 0 < n <= longest and buf.raw[:n] in texts:
                found.setdefault(buf.raw[:n], []).append(token)
        return found

    def all_pieces(self) -> set[bytes]:
        """The text of every token, as llama.cpp stores it (SPM: spaces as U+2581)."""
        return {llama_cpp.llama_vocab_get_text(self.vocab, t) for t in range(self.n_tokens)}

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def special_text(self, token: int) -> str:
        return self.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""


class Tokenizer:
    """The model's vocabulary alone (no weights): tokenize prompts and read the chat template."""

    def __init__(self, model_path: str) -> None:
        self._model: Optional[llama_cpp.llama_model_p] = _load_model(model_path, model_params(vocab_only=True))
        self._vocab = _Vocab(self._model)
        v = self._vocab.vocab
        self.bos_text = self._vocab.special_text(llama_cpp.llama_vocab_bos(v))
        self.eos_text = self._vocab.special_text(llama_cpp.llama_vocab_eos(v))
        # A vocab-only load leaves the hyper-parameters unset, so read the context from metadata.
        arch = self.metadata("general.architecture") or "llama"
        self.n_ctx_train = int(self.metadata(f"{arch}.context_length") or 0)
        self.n_vocab = self._vocab.n_tokens
        template = llama_cpp.llama_model_chat_template(self._model, None)
        self.chat_template: Optional[str] = template.decode("utf-8") if template else None
        self._gaps: Optional[SpmGaps] = None

    def metadata(self, key: str) -> Optional[str]:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def all_metadata(self) -> dict[str, str]:
        """Every scalar GGUF metadata value as text (llama.cpp leaves arrays out)."""
        out: dict[str, str] = {}
        key, value = ctypes.create_string_buffer(256), ctypes.create_string_buffer(4096)
        for i in range(llama_cpp.llama_model_meta_count(self._model)):
            llama_cpp.llama_model_meta_key_by_index(self._model, i, key, len(key))
            n = llama_cpp.llama_model_meta_val_str_by_index(self._model, i, value, len(value))
            if n >= len(value):  # snprintf semantics: n is the full length
                value = ctypes.create_string_buffer(n + 1)
                llama_cpp.llama_model_meta_val_str_by_index(self._model, i, value, len(value))
            out[key.value.decode("utf-8", "replace")] = value.value.decode("utf-8", "replace")
        return out

    def info(self) -> VocabInfo:
        return VocabInfo(self.chat_template, self.bos_text, self.eos_text, self.n_ctx_train, self.n_vocab,
                         self.all_metadata(), gpu_offload_supported())

    def tokenize(self, text: str, add_bos: bool = True) -> array[int]:
        """Prompt tokens; special tokens written in the text (<|im_start|>) are parsed as such."""
        return self._vocab.tokenize(text, add_special=add_bos, parse_special=True)

    def tokenize_into(self, data: bytes, add_bos: bool, out_address: int, capacity: int) -> int:
        """Tokenize UTF-8 `data` straight into `capacity` int32s at `out_address` (shared memory);
        returns the token count, or minus the count needed when `capacity` is too small."""
        out = ctypes.cast(out_address, ctypes.POINTER(llama_cpp.llama_token))
        return int(llama_cpp.llama_tokenize(self._vocab.vocab, data, len(data), out, capacity, add_bos, True))

    def one_token(self, choices: Sequence[str]) -> tuple[bool, ...]:
        """Whether a token spells each choice alone, bare or after one space (a byte token too),
        as a worker answers it from the logits (workers/llama/sampling.py choice_tokens)."""
        spelled = self._vocab.tokens_spelling({v for c in choices for v in choice_spellings(c)})
        return tuple(any(v in spelled for v in choice_spellings(c)) for c in choices)

    def gaps(self) -> Optional[SpmGaps]:
        """The characters this vocabulary cannot take (workers/llama/vocab_gaps.py): only llama.cpp's SPM
        tokenizer spells characters through byte_to_token, so None for the others. Built on first
        use (a call per token of the vocabulary)."""
        spm = llama_cpp.llama_vocab_type(self._vocab.vocab) == llama_cpp.LLAMA_VOCAB_TYPE_SPM
        if self._gaps is None and spm:
            self._gaps = SpmGaps(self._vocab.all_pieces())
        return self._gaps

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None


class _Batch:
    """A llama_batch whose arrays are numpy buffers we own, so filling it is a few slice copies
    instead of one ctypes call per token. Never passed to llama_batch_free."""

    def __init__(self, capacity: int) -> None:
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_id_storage = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self.seq_id_storage.ctypes.data
        # Each token belongs to exactly one sequence: seq_id[i] points at seq_id_storage[i].
        self._seq_ptrs = (i32p * capacity)(*[ctypes.cast(base + 4 * i, i32p) for i in range(capacity)])
        # Fields given to the constructor: llama_cpp annotates these pointer fields as arrays.
        self.struct = llama_cpp.llama_batch(
            token=self.token.ctypes.data_as(i32p), embd=ctypes.POINTER(ctypes.c_float)(),
            pos=self.pos.ctypes.data_as(i32p), n_seq_id=self.n_seq_id.ctypes.data_as(i32p),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)))


class ModelRunner:
    """One model + one multi-sequence context. Sequence ids are plain ints in [0, n_seq_max)."""

    def __init__(self, model_path: str, n_threads: int, n_ctx: int, n_seq_max: int, n_batch: int,
                 kv_unified: bool, flash_attn: bool = True, repack: bool = True) -> None:
        self._key = (model_path, repack)  # where close(keep_model=True) leaves the model
        self.model: Optional[llama_cpp.llama_model_p] = (
            _preloaded.pop(self._key, None)
            or _load_model(model_path, model_params(vocab_only=False, repack=repack)))
        self.vocab = _Vocab(self.model)
        params = llama_cpp.llama_context_default_params()
        # Explicit thread counts: the defaults ignore CPU affinity and oversubscribe pinned workers.
        set_fields(params, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_seq_max=n_seq_max,
                   n_threads=n_threads, n_threads_batch=n_threads, kv_unified=kv_unified, no_perf=True)
        if not flash_attn:
            # Flash attention's online softmax depends on how many KV cells it scans, which
            # changes with the batch; the plain path adds exact zeros for masked cells instead.
            set_fields(params, flash_attn_type=llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        llama_log.errors.clear()
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise ModelLoadError(describe_context_failure(model_path, n_ctx, n_seq_max, list(llama_log.errors)))
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_threads = int(llama_cpp.llama_n_threads(self.ctx))
        self.n_batch = n_batch
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        # What the KV operations may ask of this memory (workers/engine/memory_kind.py decides from it).
        self.memory_kind = MemoryKind.of(bool(llama_cpp.llama_model_is_recurrent(self.model)),
                                         bool(llama_cpp.llama_model_is_hybrid(self.model)))
        self.batch = _Batch(n_batch)

    # -- decoding -------------------------------------------------------------------------------

    def decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray,
               logits: np.ndarray) -> int:
        """One llama_decode over the given tokens. Returns llama.cpp's status
        (0 ok, 1 no KV slot for the batch: shrink it and retry)."""
        n = len(tokens)
        if n > self.n_batch:  # llama.cpp aborts the whole process (GGML_ASSERT) past n_batch
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        b = self.batch
        b.token[:n] = tokens
        b.pos[:n] = positions
        b.seq_id_storage[:n] = seq_ids
        b.logits[:n] = logits
        b.struct.n_tokens = n
        return int(llama_cpp.llama_decode(self.ctx, b.struct))

    def logits(self, n_outputs: int) -> np.ndarray:
        """The last decode's logits rows, one per token that asked for them, in batch order (a view
        of llama.cpp's buffer: read it before the next decode)."""
        ptr = llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.vocab.n_tokens))

    def set_threads(self, n: int) -> int:
        """Run the next decodes with n threads, prompt and generation alike; returns the count
        llama.cpp reports. llama_set_n_threads changes a live context: the CPU backend reads the
        count at each graph computation, so nothing is rebuilt."""
        llama_cpp.llama_set_n_threads(self.ctx, n, n)
        self.n_threads = int(llama_cpp.llama_n_threads(self.ctx))
        return self.n_threads

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of a sequence (-1: from the start, to the end). False where
        llama.cpp refuses: a partial removal on recurrent memory (memory_kind.py)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def close(self, keep_model: bool = False) -> None:
        """Free the context, and the model unless keep_model: then the next ModelRunner of the same
        path and repack setting takes it over, as it takes a preloaded one."""
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            if keep_model:
                _preloaded[self._key] = self.model
            else:
                llama_cpp.llama_model_free(self.model)
            self.model = None
