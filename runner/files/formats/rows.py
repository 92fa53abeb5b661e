"""What an answers file is made of, whatever its format: one Row per question in input order,
and the OutputSpec that says how to write them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Container, Optional, Sequence

from ....workers.protocol import Answer, Sample, TokenLogprob
from .harmony import harmony_span, split_harmony
from .token_logprobs import chat_content, spelling

# The error of a question the run never answered (it ended first, or no shard held it), as
# against one answered with an error: `ggbatch score` tells the two apart by it.
NOT_ANSWERED = "not answered"


def not_answered(why: str) -> str:
    return f"{NOT_ANSWERED}: {why}"


def is_not_answered(error: Any) -> bool:
    """Whether a row's error says the question was never answered (not_answered, or the bare word)."""
    return isinstance(error, str) and (error == NOT_ANSWERED or error.startswith(NOT_ANSWERED + ":"))


@dataclass(frozen=True)
class Row:
    qid: str
    answer: Optional[Answer]  # the answer it got (an identical prompt's, when deduplicated)
    error: Optional[str] = None  # why it has no answer (None: answered)


@dataclass(frozen=True)
class OutputSpec:
    format: str  # json, jsonl, csv or openai
    id_field: str = "questionID"
    keep_thinking: bool = False
    # OpenAI Batch output only
    model_name: str = ""  # the GGUF's general.name, else its file name
    completions: Container[str] = frozenset()  # ids of /v1/completions lines (text_completion objects)
    responses: Container[str] = frozenset()  # ids of /v1/responses lines (response objects)
    refused: Container[str] = frozenset()  # ids of requests refused as asked (answered with a 400)
    started: float = 0.0  # Unix time the run started: "created" of a line that has no answer
    choice_logprobs: bool = False  # answers carry choice_logprobs (answer.logprobs): CSV gives them a column
    token_logprobs: bool = False  # answers carry token_logprobs (answer.token_logprobs): CSV gives them a column
    answer_norm: bool = False  # answers carry answer_norm (choices scored by log-likelihood): CSV gives it a column
    samples: bool = False  # some questions draw several samples: CSV writes their list as JSON, and a samples column
    integer_ids: bool = False  # every id was a JSON integer: JSON and JSON Lines write them as numbers
    errors_apart: bool = False  # the rows without an answer go to errors_output: CSV has no error column


def split_thinking(text: str) -> tuple[Optional[str], str]:
    """(reasoning, answer) of a reasoning model's output: `<think>…</think>` at the start, or
    everything before `</think>` when the chat template itself opened the block; gpt-oss's
    analysis and final channels (harmony.py)."""
    harmony = split_harmony(text)
    if harmony is not None:
        return harmony
    end = thinking_end(text)
    if end is None:
        return None, text
    start = text.find("<think>")
    thinking = text[start + len("<think>") if start != -1 else 0:end - len("</think>")]
    return thinking.strip(), text[end:]


def thinking_end(text: str) -> Optional[int]:
    """Where the answer begins after a `<think>` block at the start of `text` (just past its
    `</think>`), or None when it has none."""
    end = text.find("</think>")
    if end == -1:
        return None
    start = text.find("<think>")
    if start != -1 and (start > end or text[:start].strip()):
        return None  # a tag in the middle of an answer is the answer's business
    return end + len("</think>")


def unfinished_thinking(text: str) -> str:
    """The thinking of an output that ended inside its block (Answer.in_thinking): without the
    block's opening (`<think>`, or the analysis channel's header, when the model wrote it) and
    any part of the end written for it when max_tokens cut that short."""
    harmony = split_harmony(text)
    if harmony is not None:
        return harmony[0] or ""
    bare = text.lstrip()
    return (bare[len("<think>"):] if bare.startswith("<think>") else bare).strip()


def shown_answer(text: str, picked: bool, in_thinking: bool = False) -> tuple[Optional[str], str]:
    """(thinking, the answer as written): a generated text without a reasoning model's thinking
    block and the spaces around it; a choice picked by log-likelihood (`picked`) as the job spelt
    it, spaces included, as its answer_norm is (the choices " barked" and "barked" differ). An
    output that ended inside its thinking (`in_thinking`) is all thinking and no answer, as
    llama-server's and vLLM's reasoning parsers read a block that never closes."""
    if picked:
        return None, text
    if in_thinking:
        return unfinished_thinking(text), ""
    thinking, answer = split_thinking(text)
    return thinking, answer.strip()


def answer_span(text: str, picked: bool = False, in_thinking: bool = False) -> tuple[int, int]:
    """Where the answer shown_answer gives lies in `text`, in characters, before its surrounding
    whitespace is stripped: after a reasoning model's thinking block (and harmony's final header),
    empty when the output ended inside the thinking."""
    if picked:
        return 0, len(text)
    if in_thinking:
        return len(text), len(text)
    harmony = harmony_span(text)
    if harmony is not None:
        return harmony
    return thinking_end(text) or 0, len(text)


def answer_logprobs(text: str, entries: Sequence[TokenLogprob], in_thinking: bool = False) -> list[dict[str, Any]]:
    """The token log-probabilities of the answer's own tokens, as chat_content writes them: a
    reasoning model's thinking block, and the end of it ggbatch wrote when the budget ran out,
    are no part of the answer (the entries cover every generated token: /v1/completions text
    keeps the thinking)."""
    return chat_content(spelling(entries, *answer_span(text, False, in_thinking)))


def row_fields(row: Row, id_field: str, keep_thinking: bool) -> dict[str, Any]:
    """{id: ..., "answer": ...} (and "thinking" if asked), or {id, "answer": None, "error": why}.
    A reasoning model's `<think>` block is taken out of the answer."""
    out: dict[str, Any] = {id_field: row.qid}
    if row.error is not None or row.answer is None:
        out.update(answer=None, error=row.error)
        return out
    if row.answer.samples is not None:
        return _sample_fields(out, row.answer.samples, keep_thinking)
    thinking, out["answer"] = shown_answer(row.answer.text, row.answer.answer_norm is not None, row.answer.in_thinking)
    if row.answer.answer_norm is not None:
        out["answer_norm"] = row.answer.answer_norm
    if keep_thinking and thinking is not None:
        out["thinking"] = thinking
    if row.answer.choice_logprobs is not None:
        out["choice_logprobs"] = row.answer.choice_logprobs
    if row.answer.token_logprobs is not None:
        out["token_logprobs"] = answer_logprobs(row.answer.text, row.answer.token_logprobs, row.answer.in_thinking)
    return out


def _sample_fields(out: dict[str, Any], samples: Sequence[Sample], keep_thinking: bool) -> dict[str, Any]:
    """A question's n samples: "answer" (and "thinking", "token_logprobs") as lists in sample order;
    a sample without an answer (cut before its choice or grammar was complete) is null there."""
    split = [shown_answer(s.text, False, s.in_thinking) for s in samples]
    out["answer"] = [None if s.error else text for s, (_, text) in zip(samples, split)]
    if keep_thinking and any(thinking is not None for thinking, _ in split):
        out["thinking"] = [thinking for thinking, _ in split]
    if any(s.token_logprobs is not None for s in samples):
        out["token_logprobs"] = [answer_logprobs(s.text, s.token_logprobs or (), s.in_thinking) for s in samples]
    return out
