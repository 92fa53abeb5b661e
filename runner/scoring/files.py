"""Reading the two sides of a score: an answers file and a gold file. Every problem is an
InputError naming the file and line, like the question reader's.

Answers files, told apart by extension and by each row's keys:
- ggbatch's own output: a `.json` array or `.jsonl` rows `{"questionID", "answer", "error"?}`
  (the id and answer field names configurable); `"answer": null` is no answer.
- OpenAI Batch output lines: `{"custom_id", "response": {"status_code", "body"}, "error"}`, the
  text in `body.choices[0].message.content` (chat), `body.choices[0].text` (completions) or the
  Responses API's `output_text` parts (with the answer field `answer_norm`, the acc_norm pick
  ggbatch writes in `body.choices[0].answer_norm`); an error or a non-200 status is no answer.
- CSV with a header row: the id column and the answer column (an empty answer beside an `error`
  is a failed question: no answer, as null is in JSON).
Gold files: any question file (`.json`, `.jsonl`, or CSV) whose records carry the gold field;
records without it (null, or an empty string) are counted, not scored. Their `choices` come in
any shape runner/files/formats/choices.py reads; an integer gold answer indexes a list of them.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any, Iterator, Mapping, Optional, Union

from ..errors import InputError, quote

# The question reader's parsing (line numbers, U+2028-safe line splitting, CSV rows named by the
# line they start on) is the one every file of questions goes through; answers and gold files
# are read the same way.
from ..files.formats.choices import Choices, read_choices
from ..files.formats.likely_fields import field_hint
from ..files.formats.record import checked_id
from ..files.formats.rows import is_not_answered
from ..files.formats.table_rows import table_rows
from ..files.inputs import detect_format, read_text
from .rules import Gold


def read_rows(path: str, what: str) -> Iterator[tuple[int, Any]]:
    """(line, row) of a `.json` array, JSON Lines, or CSV with a header (rows as dicts); `what`
    the file is to the score, for its errors."""
    text = read_text(path)
    fmt = detect_format(path, text, what=what)
    finite = what != "answers file"  # ggbatch's answers may hold a logprob of -Infinity; gold files are questions
    return table_rows(path, text, fmt, finite)


# An answer's text, or the texts of its samples (sampling.n), in sample order (None: a sample
# without an answer)
Answered = Union[str, list[Optional[str]], None]


def read_answers(path: str, id_field: str = "questionID",
                 answer_field: str = "answer") -> tuple[dict[str, Answered], set[str]]:
    """(id -> answer text, or the list of a question's samples (None: the row has no answer:
    null, an error, a failed request); the ids of rows that say the run never answered them: it
    ended first, or no shard held them)."""
    answers: dict[str, Answered] = {}
    unanswered: set[str] = set()
    lines: dict[str, int] = {}
    # the fields of the rows that are not OpenAI Batch lines, in order, while none has the answer's
    fields: Optional[dict[str, None]] = {}
    for line, row in read_rows(path, "answers file"):
        where = f"{path}:{line}"
        if not isinstance(row, dict):
            raise InputError(f"{where}: each answer must be a JSON object, got {type(row).__name__}")
        if id_field not in row and "custom_id" in row:
            qid = row_id(where, row, "custom_id")
            text = openai_norm(row) if answer_field == "answer_norm" else openai_text(row)
        else:
            qid, text = row_id(where, row, id_field), _answer(where, row, answer_field)
            if fields is not None and answer_field in row:
                fields = None
            elif fields is not None:
                fields.update(dict.fromkeys(map(str, row)))
        if qid in lines:
            raise InputError(f"{path}: duplicate answer for {quote(qid)} (lines {lines[qid]} and {line})")
        lines[qid], answers[qid] = line, text
        if text is None and _never_answered(row):
            unanswered.add(qid)
    if fields:  # a misspelt --answer-field would score every answer missing
        raise InputError(f"{path}: no row has an answer '{answer_field}' (the rows have: "
                         f"{', '.join(list(fields)[:8])}); name it with --answer-field"
                         f"{field_hint('--answer-field', answer_field, [f for f in fields if f != id_field])}")
    return answers, unanswered


def _never_answered(row: Mapping[str, Any]) -> bool:
    """Whether a row without an answer says why as a run that ended first writes it: its error
    (is_not_answered), or an OpenAI Batch line's error code."""
    error = row.get("error")
    if isinstance(error, dict):
        return error.get("code") == "not_answered"
    return is_not_answered(error)


def openai_text(row: Mapping[str, Any]) -> Answered:
    """The answer text of one OpenAI Batch output line (the texts of its choices, by index, when
    it has several), or None for an error or an odd shape."""
    body = _body(row)
    if body is None:
        return None
    choices = body.get("choices")
    if isinstance(choices, list) and choices and all(isinstance(c, dict) for c in choices):
        texts = [_choice_text(c) for c in sorted(choices, key=lambda c: c.get("index") or 0)]
        return texts[0] if len(texts) == 1 else texts  # a choice without content: a sample without an answer
    parts = [part.get("text") for part in _output_texts(body)]
    return "".join(p for p in parts if isinstance(p, str)) if parts else None


def openai_norm(row: Mapping[str, Any]) -> Optional[str]:
    """The acc_norm pick ggbatch writes beside an OpenAI line's first choice, or in a response's
    output_text part (`answer_norm`, with answer.choice_scoring: loglikelihood), or None."""
    body = _body(row)
    if body is None:
        return None
    choices = body.get("choices")
    parts = _output_texts(body)
    first = choices[0] if isinstance(choices, list) and choices else parts[0] if parts else None
    norm = first.get("answer_norm") if isinstance(first, dict) else None
    return norm if isinstance(norm, str) else None


def _output_texts(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Responses API body's output_text parts, in order (its reasoning items hold none)."""
    return [c for item in body.get("output") or [] if isinstance(item, dict)
            for c in item.get("content") or [] if isinstance(c, dict) and c.get("type") == "output_text"]


def _body(row: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """An OpenAI Batch output line's response body; None for an error or a non-200 status."""
    response = row.get("response")
    if row.get("error") or not isinstance(response, dict) or response.get("status_code", 200) != 200:
        return None
    body = response.get("body")
    return body if isinstance(body, dict) else None


def read_gold(path: str, id_field: str = "questionID", gold_field: str = "answer") -> tuple[list[Gold], set[str]]:
    """(gold questions in file order, ids of the records without a gold answer: none, null or
    empty, since an empty gold answer would score every answer wrong)."""
    gold: list[Gold] = []
    lines: dict[str, int] = {}
    without: set[str] = set()
    for line, row in read_rows(path, "gold file"):
        where = f"{path}:{line}"
        if not isinstance(row, dict):
            raise InputError(f"{where}: each record must be a JSON object, got {type(row).__name__}")
        qid = row_id(where, row, id_field)
        if qid in lines:
            raise InputError(f"{path}: duplicate {id_field} {quote(qid)} (lines {lines[qid]} and {line})")
        lines[qid] = line
        choices = _choices(where, row.get("choices"))
        answer = _gold(where, row, gold_field, choices)
        if answer is None or not answer.strip():
            without.add(qid)
            continue
        gold.append(Gold(qid, answer, choices.by_label() if choices else None))
    return gold, without


def first_fields(path: str) -> list[str]:
    """The field names of a file's first record (none for an empty file), for an error that says
    which field was probably meant."""
    first = next(read_rows(path, "gold file"), None)
    return [str(name) for name in first[1]] if first and isinstance(first[1], dict) else []


def row_id(where: str, row: Mapping[str, Any], field: str) -> str:
    """A row's id as a string (ids are kept as strings, as the question reader keeps them)."""
    if field not in row:
        keys = ", ".join(map(str, list(row)[:8]))
        raise InputError(f"{where}: no '{field}' field (it has: {keys}); name the id field with --id-field"
                         f"{field_hint('--id-field', field, row)}")
    qid = row[field]
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise InputError(f"{where}: '{field}' must be a string or an integer, got {type(qid).__name__}")
    return checked_id(where, str(qid), field)


def _choice_text(choice: Mapping[str, Any]) -> Optional[str]:
    if choice.get("error"):
        return None  # a completion sample without an answer: its text is "" only for openai's types
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else None


def _answer(where: str, row: Mapping[str, Any], field: str) -> Answered:
    """An answers file's answer: a text, or a list of sample texts (JSON; in CSV, JSON text in the
    cell of a row whose `samples` column is set). A row with an error and no answer has none (a
    failed question: null in JSON, an empty cell beside its error in CSV)."""
    value = row.get(field)
    if value in ("", None) and row.get("error"):
        return None
    if isinstance(value, str) and str(row.get("samples") or "").strip():
        try:
            value = json.loads(value)
        except ValueError:
            raise InputError(f"{where}: '{field}' of a row with samples must be a JSON list of texts") from None
    if isinstance(value, list):
        if not value or not all(v is None or isinstance(v, str) for v in value):
            raise InputError(f"{where}: '{field}' must be a text or a list of sample texts, got {quote(value)}")
        return value
    return _text(where, row, field)


def _text(where: str, row: Mapping[str, Any], field: str) -> Optional[str]:
    value = row.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"{where}: '{field}' must be a string or a number, got {quote(value)}")
    if isinstance(value, float) and math.isfinite(value):  # 1e-07 as written in the file: 0.0000001
        return format(Decimal(repr(value)), "f")
    return str(value)


def _choices(where: str, value: Any) -> Optional[Choices]:
    """A gold record's choices, in any shape runner/files/formats/choices.py reads. An empty text is
    none: a CSV row without choices can only leave its cell empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    read = read_choices(value)
    if read is None:
        raise InputError(f"{where}: 'choices' must be a list of texts, a mapping of labels to texts or "
                         f"Hugging Face's {{\"text\": [...], \"label\": [...]}}, got {quote(value)}")
    return read


def _gold(where: str, row: Mapping[str, Any], field: str, choices: Optional[Choices]) -> Optional[str]:
    """A gold answer as text. An integer with a list of choices is an index into it, as Hugging
    Face's MMLU, PIQA and lm-eval's doc_to_target give it: the gold answer is that choice's text."""
    value = row.get(field)
    if choices is None or choices.labels is not None or isinstance(value, bool) or not isinstance(value, int):
        return _text(where, row, field)
    if not 0 <= value < len(choices.texts):
        raise InputError(f"{where}: gold '{field}' {value} is an index into 'choices' (an integer), but the "
                         f"record has {len(choices.texts)} choices (0 to {len(choices.texts) - 1})")
    return choices.texts[value]
