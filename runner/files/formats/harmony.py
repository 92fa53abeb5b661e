"""gpt-oss's harmony format, as its output reads: messages on channels, the analysis channel the
thinking, the final channel the answer (the answers file holds the final channel only).

    <|channel|>analysis<|message|>THINKING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER

The first header is missing when the prompt opened the analysis channel itself; the engine writes
the markers into the text (workers/llama/engine.py renders the thinking block's tokens).
"""

from __future__ import annotations

import re
from typing import Optional

# A SentencePiece vocabulary writes a word after a special token with its leading space
# (`<|channel|> final`): the markers allow it.
ANALYSIS = re.compile(r"<\|channel\|>\s?analysis\s?<\|message\|>")
FINAL = re.compile(r"<\|channel\|>\s?final\s?<\|message\|>")
NEXT_MESSAGE = re.compile(r"<\|end\|><\|start\|>\s?assistant")
ENDS = ("<|end|>", "<|return|>", "<|call|>")


def split_harmony(text: str) -> Optional[tuple[Optional[str], str]]:
    """(thinking, answer) of a harmony output; None when the text is not one. An analysis never
    followed by a final channel (cut by max_tokens, maybe in the switch) is thinking without an
    answer."""
    final = FINAL.search(text)
    if final is None:  # cut by max_tokens before the final channel: no answer
        opening = ANALYSIS.match(text)
        if opening is None and "<|end|><|start|>" not in text:
            return None
        return _message(text[opening.end() if opening else 0:]).strip(), ""
    before, answer = text[:final.start()], _message(text[final.end():])
    analysis = ANALYSIS.search(before)
    if analysis is not None:
        before = before[analysis.end():]
    elif NEXT_MESSAGE.search(before) is None:
        return None, answer  # the final channel alone: no thinking
    return _message(before).strip(), answer


def harmony_span(text: str) -> Optional[tuple[int, int]]:
    """Where split_harmony's answer (the final channel's message) lies in `text`, in characters:
    after the channel's header, up to the token that ends it; (len, len) when there is none yet;
    None when the text is not a harmony output."""
    if split_harmony(text) is None:
        return None
    final = FINAL.search(text)
    if final is None:
        return len(text), len(text)
    return final.end(), final.end() + len(_message(text[final.end():]))


def _message(text: str) -> str:
    """A message's content: up to the token that ends it."""
    cut = min((i for i in (text.find(end) for end in ENDS) if i != -1), default=len(text))
    return text[:cut]
