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

from array import array
from typing import Optional, Sequence, TypeVar, Union

from ..config.answer import spelling_problem
from ..errors import quote
from .tokenizing import Rejected

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


def pair_texts_of(prompt: str, choices: tuple[str, ...]) -> list[str]:
    """What a prompt sends the tokenizer: the prompt alone, or with choices scored as its
    continuations the context and each context + continuation, as lm-eval encodes them."""
    if not choices:
        return [prompt]
    pairs = [pair_texts(prompt, continuation_text(choice)) for choice in choices]
    return [pairs[0][0]] + [whole for _, whole in pairs]


def unspellable(choices: tuple[str, ...], tokenized: list[Union[array[int], Rejected]],
                unknown_token: Optional[int]) -> Optional[Rejected]:
    """The first of a record's own choices the model cannot write, as the record's failure: by the
    rule the job's own choices are checked by (runner/config/answer.py spelling_problem)."""
    for choice, tokens in zip(choices, tokenized):
        why = spelling_problem(tokens.reason if isinstance(tokens, Rejected) else tokens, unknown_token)
        if why is not None:
            return Rejected(f"its choice {quote(choice)} cannot be an answer: {why}")
    return None


def split_tokens(context: Union[array[int], Rejected], wholes: list[Union[array[int], Rejected]]
                 ) -> tuple[Union[array[int], Rejected], tuple[array[int], ...]]:
    """(the context's tokens, each continuation's) from what the tokenizer gave pair_texts_of's
    texts, or the first Rejected among them."""
    for tokens in (context, *wholes):
        if isinstance(tokens, Rejected):
            return tokens, ()
    assert isinstance(context, array)
    return context, tuple(split_pair(whole, context)[1] for whole in wholes if isinstance(whole, array))


def scored_tokens(context: array[int], continuations: tuple[array[int], ...]) -> array[int]:
    """What identifies a question's prompt in its hash: its tokens, and each continuation after a
    separator no vocabulary holds (equal contexts with other continuations are other questions)."""
    if not continuations:
        return context
    out = array("i", context)
    for cont in continuations:
        out.append(-1)
        out.extend(cont)
    return out
