"""The vocabulary written into the models modelgen makes: the ``tokenizer.*`` metadata of a
GGUF, copied from a vocab-only GGUF (a real model's tokenizer and chat template) or built here
(the demo model's small SentencePiece vocabulary with ChatML specials). Metadata only: the
tokenizer a job runs is llama.cpp's (workers/llama/model_runner.py).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import gguf

from ..gguf_header import MAGIC, NO_MAGIC

_V = gguf.GGUFValueType
# GGUFVocab attribute <-> GGUF key, with the value types llama.cpp expects (it checks them).
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
class GGUFVocab:
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


def vocab_from_gguf(path: str | os.PathLike[str]) -> GGUFVocab:
    """Read all ``tokenizer.*`` fields of a (vocab-only or full) GGUF, e.g. ggml-vocab-qwen2.gguf."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != MAGIC:  # else numpy's words on a file under 4 bytes, gguf's on the rest
                raise ValueError(f"{path}: not a GGUF file ({NO_MAGIC})")
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError) as exc:
        if str(exc).startswith(f"{path}: "):
            raise
        # a GGUF cut short: gguf's and numpy's words (array sizes and dtypes) name no file
        raise ValueError(f"{path}: the vocab file is truncated or corrupt (not a whole GGUF)") from None
    except OSError as exc:  # else make-model would blame its output
        raise ValueError(f"{path}: cannot read the vocab file ({exc.strerror or exc})") from None
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
    return GGUFVocab(**values, extra=extra)


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


def build_demo_vocab(n_merges: int = 400) -> GGUFVocab:
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
    return GGUFVocab(
        model="llama", tokens=tokens, token_types=[int(t) for t in types], scores=scores,
        bos_id=1, eos_id=2, unk_id=0, eot_id=tokens.index("<|im_end|>"),
        add_bos=True, add_eos=False, chat_template=_CHATML_TEMPLATE,
    )
