"""Which characters llama.cpp's SPM tokenizer cannot take. Pure: works on the vocabulary's token texts.

llama.cpp's SPM tokenizer (src/llama-vocab.cpp, llm_tokenizer_spm_session) starts from single
characters (a space written as U+2581), merges neighbours only into tokens of the vocabulary, and
spells each character left alone in byte tokens: `llama_vocab::byte_to_token` looks up `<0xE2>`,
then the raw byte, with `token_to_id.at()`, which throws std::out_of_range when neither exists.
Through ctypes that exception is std::terminate: the process aborts. Most SPM vocabularies have
all 256 byte tokens; TinyStories-656K has 77, and aborts on ’ (a quarter of GSM8K's questions).
Checked on 3,920 questions (GSM8K, TruthfulQA, MMLU, LSAT-RC) with that model: llama.cpp aborted
on exactly the 1,033 holding a character `unknown` names.
"""

from __future__ import annotations

SPM_SPACE = "\u2581"


class SpmGaps:
    """The characters an SPM vocabulary has neither a token nor byte tokens for."""

    def __init__(self, pieces: set[bytes]) -> None:
        self._pieces = pieces  # every token's text, as llama.cpp stores it
        self._in_tokens = {c for p in pieces for c in p.decode("utf-8", "ignore")}
        self._bytes = {b for b in range(256) if bytes([b]) in pieces or b"<0x%02X>" % b in pieces}
        self._spellable: dict[str, bool] = {}

    def unknown(self, text: str) -> list[str]:
        """Characters of `text` with no token and no byte spelling, in order of appearance:
        llama.cpp aborts on each, unless a merge takes it into a longer token."""
        return [c for c in dict.fromkeys(text) if not self._can_spell(c)]

    def certain(self, text: str) -> list[str]:
        """Those of `unknown(text)` that no token contains at all: no merge can take them, so
        llama.cpp aborts on any text holding one."""
        return [c for c in self.unknown(text) if _spm(c) not in self._in_tokens]

    def _can_spell(self, c: str) -> bool:
        known = self._spellable.get(c)
        if known is None:
            data = _spm(c).encode()
            known = self._spellable[c] = data in self._pieces or all(b in self._bytes for b in data)
        return known


def _spm(c: str) -> str:
    return SPM_SPACE if c == " " else c
