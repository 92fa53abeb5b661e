"""The messages of the coordinator's two helper processes: those that load llama.cpp but answer
no question. Both cross as `encode`/`decode` bytes (workers/protocol.py).

The coordinator tokenizes through a tokenizer process (runner/questions/tokenizing.py,
workers/tokenizer/process.py), because llama.cpp's tokenizer can abort the process on text its
vocabulary cannot represent:

    coordinator                         tokenizer process
        │ ── start(model path) ──────────▶ │  loads the vocabulary only
        │ ◀─────── VocabInfo | TokenizerLoadError
        │ ── TokenizeBatch ──────────────▶ │  hundreds of prompts per message
        │ ◀─────────────── TokenizedBatch ── │  tokens, or why not, for each
        │ ── SpellChoices ───────────────▶ │  fixed choices (answer.logprobs)
        │ ◀───────────────── tuple[bool] ── │  whether a token spells each alone

A job with GPU layers asks a short-lived process what the GPUs have free before its workers load
(runner/pool/gpu_probe.py, workers/llama/gpu_memory.py):

    coordinator                         GPU probe
        │ ── start ──────────────────────▶ │  asks ggml's device registry
        │ ◀──────── tuple[GpuMemory, ...] ── │  then exits
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as llama.cpp sees it (numbered as `devices` numbers them), read before any worker
    loads (runner/pool/gpu_probe.py)."""

    name: str
    free: int  # bytes of its memory free now
    total: int


@dataclass(frozen=True)
class VocabInfo:
    """What the coordinator needs of the model without its weights: for the chat template, the
    context size and the memory plan (runner/plan/memory.py dims_from_metadata)."""

    chat_template: Optional[str]
    bos_text: str
    eos_text: str
    n_ctx_train: int
    n_vocab: int
    metadata: dict[str, str]  # GGUF key -> scalar value as text
    gpu_offload: bool = False  # this llama.cpp build can offload layers to a GPU


@dataclass(frozen=True)
class TokenizerLoadError:
    message: str  # ModelLoadError's one line


@dataclass(frozen=True)
class TokenizeBatch:
    texts: tuple[str, ...]
    add_bos: tuple[bool, ...]  # per text: False when the chat template wrote BOS itself


@dataclass(frozen=True)
class SpellChoices:
    """Asks whether each choice is one token after the prompt, as a worker finds it
    (workers/llama/sampling.py choice_tokens): a token spells it bare or after one space."""

    choices: tuple[str, ...]


@dataclass(frozen=True)
class TokenizedBatch:
    """One result per text of a TokenizeBatch, as flat arrays (one pickled object, not hundreds)."""

    tokens: array[int]  # array('i'): every text's tokens, one text after the other
    counts: array[int]  # array('i'): each text's token count; -1 where it could not be tokenized
    errors: dict[int, str] = field(default_factory=dict)  # index in the batch -> why not
