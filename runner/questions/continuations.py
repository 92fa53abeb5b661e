"""Choices as continuations of a prompt, tokenized as lm-evaluation-harness tokenizes them
(TemplateLM._encode_pair), so a choice's log-likelihood here is the one lm-eval computes:

    choice "Paris"  ─▶ continuation " Paris"          (lm-eval's default target_delimiter, a space)
    context "Q: ...\nA: " + " Paris"
        ─▶ texts ("Q: ...\nA:", "Q: ...\nA:  Paris")  (the context's trailing whitespace moves to the continuation)
        ─▶ both tokenized ─▶ context tokens, whole[len(context tokens):] as the continuation's

Encoding the two together and splitting at the context's length keeps a word-boundary space
with the word, as the tokenizer merges it. The job's answer.choice_scoring: loglikelihood and
ggbatch.lm_eval (package/lm_eval.py) both tokenize through here.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

TARGET_DELIMITER = " "  # lm-eval's default between a context and a multiple-choice target

T = TypeVar("T", bound=Sequence[int])


def continuation_text(choice: str) -> str:
    """A choice as the text that continues the prompt: after lm-eval's target delimiter, unless it
    starts with whitespace of its own (then it is taken as written)."""
    return choice if choice[:1].isspace() else TARGET_DELIMITER + choice


def pair_texts(context: str, continuation: str) -> tuple[str, str]:
    """(context, context + continuation) as lm-eval encodes them: the context's trailing whitespace
    moved to the continuation's start."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    return context, context + continuation


def split_pair(whole: T, context: T) -> tuple[T, T]:
    """(context tokens, continuation tokens): the whole's tokens split at the context's length."""
    return context, whole[len(context):]  # type: ignore[return-value]  # a slice of T is a T for list and array
