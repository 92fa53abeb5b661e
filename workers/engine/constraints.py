"""What an answer must be, in the terms llama.cpp's grammar sampler takes, and the pick among fixed
choices from their log-probabilities. Pure: no llama.cpp here (workers/llama/sampling.py builds the
grammars and reads the logits)."""

from __future__ import annotations

from typing import Sequence

# A grammar llama.cpp can parse always has this root rule.
ROOT = "root"


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_grammar(choices: Sequence[str]) -> str:
    """GBNF for exactly one of the choices. One leading space is allowed, as a model writes it
    after `Answer:`; the answer is the choice without it (choice_text)."""
    return f'{ROOT} ::= " "? ({" | ".join(gbnf_literal(c) for c in choices)})\n'


def choice_text(text: str, choices: Sequence[str]) -> str:
    """The choice a generated answer under choice_grammar spells (its leading space dropped);
    the text as it is when it is none of them (cut by max_tokens)."""
    if text not in choices and text.startswith(" ") and text[1:] in choices:
        return text[1:]
    return text


def best_choice(scores: Sequence[float]) -> int:
    """The index of the highest log-probability; a tie goes to the earliest choice."""
    best = 0
    for i, score in enumerate(scores):
        if score > scores[best]:
            best = i
    return best


def choice_logprobs(choices: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
    """{choice: log-probability}, rounded to what a reader of the answers file needs."""
    return {c: round(float(s), 6) for c, s in zip(choices, scores)}


def choice_spellings(choice: str) -> tuple[bytes, bytes]:
    """The texts of a token that, generated first, is the whole choice: bare, or after one space."""
    return choice.encode("utf-8"), (" " + choice).encode("utf-8")
