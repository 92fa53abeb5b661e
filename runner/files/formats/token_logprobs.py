"""Token log-probabilities (workers/protocol.py TokenLogprob) as the journal keeps them and as the
answers files write them:

    journal            [[token, "piece as hex", logprob, [[token, "hex", logprob], ...]], ...]
    JSON, JSON Lines,  [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]
    CSV (as JSON text), an OpenAI chat line's choices[i].logprobs.content
    /v1/completions    {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}

A token's text is its bytes decoded as UTF-8; a token holding part of a character reads as
U+FFFD there, and its `bytes` are exact (as OpenAI writes them). The journal keeps the bytes as
hex, so a resumed answer carries the very same entries.
"""

from __future__ import annotations

import codecs
from typing import Any, Optional, Sequence

from ....workers.protocol import TokenLogprob


def to_journal(entries: Sequence[TokenLogprob]) -> list[list[Any]]:
    return [[e.token, e.piece.hex(), e.logprob, [[t, p.hex(), lp] for t, p, lp in e.top]] for e in entries]


def from_journal(data: Optional[Sequence[Sequence[Any]]]) -> Optional[tuple[TokenLogprob, ...]]:
    if data is None:
        return None
    return tuple(TokenLogprob(int(token), bytes.fromhex(piece), float(lp),
                              tuple((int(t), bytes.fromhex(p), float(x)) for t, p, x in top))
                 for token, piece, lp, top in data)


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_content(entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI's ChatCompletionTokenLogprob items: what JSON, JSON Lines and CSV answers write too."""
    return [{"token": _text(e.piece), "logprob": e.logprob, "bytes": list(e.piece),
             "top_logprobs": [{"token": _text(p), "logprob": lp, "bytes": list(p)} for _, p, lp in e.top]}
            for e in entries]


def completion_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """The legacy /v1/completions shape. Each position's top_logprobs maps the text of the most
    likely tokens to their log-probability (of tokens of one text, the likeliest's), and holds the
    picked token too, with its own value, where it is not among them (OpenAI: "up to logprobs+1
    elements"); text_offset: where each token's text starts in the completion, in characters."""
    tokens = [_text(e.piece) for e in entries]
    tops = []
    for e, text in zip(entries, tokens):
        top: dict[str, float] = {}
        for _, p, lp in e.top:
            if lp > top.get(_text(p), float("-inf")):
                top[_text(p)] = lp
        top[text] = e.logprob
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": text_offsets([e.piece for e in entries])}


def text_offsets(pieces: Sequence[bytes]) -> list[int]:
    """Each piece's start in the text all of them decode to, in characters: a piece holding part of
    a character starts at that character (bytes E6 97 A5 split three ways all start at 旗's), so
    the offsets count the decoded text, not each piece's own U+FFFD. An empty piece starts where
    the next character does."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    offsets, chars = [], 0
    for piece in pieces:
        start: Optional[int] = None
        for byte in piece:
            chars += len(decoder.decode(bytes((byte,))))
            pending = bool(decoder.getstate()[0])  # the byte waits in a character not yet complete
            start = (chars if pending else chars - 1) if start is None else start
        # an empty piece starts where the next character does: one pending (its bytes begun) is
        # at `chars` too, whether it completes or comes out as U+FFFD, so offsets never decrease
        offsets.append(chars if start is None else start)
    return offsets


def spelling(entries: Sequence[TokenLogprob], start: int, end: int) -> tuple[TokenLogprob, ...]:
    """The entries of the tokens that spell characters start to end of the text all of them
    decode to: a token that runs into the span from before it is kept whole, as are a character's
    byte tokens; an empty piece counts where the next character starts. Nothing when the span is
    empty."""
    if start >= end:
        return ()
    offsets = text_offsets([e.piece for e in entries])
    ends = offsets[1:] + [len(b"".join(e.piece for e in entries).decode("utf-8", errors="replace"))]
    return tuple(e for e, first, last in zip(entries, offsets, ends)
                 if first < end and (first >= start or last > start))
