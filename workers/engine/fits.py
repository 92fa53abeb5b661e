"""Whether a question fits a context per sequence: the one rule a worker turns questions away by
(workers/llama/engine.py), which the coordinator also reads to know, before any worker sees them,
which questions no context of the job can take (runner/questions/prepare.py: they share no prefix)."""

from __future__ import annotations

from typing import Optional

from ..protocol import Question


def length_problem(question: Question, n_ctx_seq: int) -> Optional[str]:
    """Why the question cannot be answered in n_ctx_seq tokens of context (None: it can). A
    generated answer needs its prompt and at least one more token; a scored one needs its context
    and its longest continuation but the last token."""
    if question.continuations:
        return scored_problem(question, n_ctx_seq)
    n = len(question.tokens)
    if n == 0:
        return "prompt is empty"
    if n >= n_ctx_seq:
        return f"prompt has {n} tokens, context per sequence is {n_ctx_seq}"
    return None


def scored_problem(question: Question, n_ctx_seq: int) -> Optional[str]:
    """Why a scored question cannot be answered (None: it can): its tokens fed to the model (the
    context and its longest continuation but that one's last token) must fit the context per
    sequence."""
    if not question.tokens:
        return "a scored continuation needs a context of one token or more (lm-eval gives BOS to an empty one)"
    longest = len(question.tokens) + max(len(c) for c in question.continuations)
    if longest - 1 > n_ctx_seq:
        return (f"context and continuation have {longest} tokens, {longest - 1} of them fed to the model, "
                f"context per sequence is {n_ctx_seq}")
    return None
