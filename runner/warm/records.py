"""A Python caller's questions as records, checked as a question file's are: strings (one string
is one question) or mappings with the question field and any fields prompt.template uses; every
problem one line naming the item by its index in the caller's list; and questions a caller made
already tokenized (Pool.submit_questions), whose tokens must be the model's."""

from __future__ import annotations

import json
from array import array
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeGuard, Union

from ...workers.protocol import Question as MadeQuestion
from ..errors import ConfigError, InputError, quote
from ..files.inputs import Record, record_at

# a question's text, a record, or a conversation (messages: {role, content} mappings)
Question = Union[str, Mapping[str, Any], Sequence[Mapping[str, Any]]]


def caller_rows(questions: Union[str, Iterable[Question]], id_field: str, question_field: str,
                source: str, single: bool = False) -> list[dict[str, Any]]:
    """The caller's questions as rows (strings and conversations numbered by their index; a data
    frame's or table's rows, _table_rows); a mapping, bytes or anything not iterable is refused:
    iterating them would ask their keys, bytes or nothing.
    `single`: the caller gave one question (Pool.submit's, in a list of one), named `question`."""
    if isinstance(questions, str):
        questions = [questions]
    table = _table_rows(questions)
    if table is not None:
        questions = table
    if isinstance(questions, (Mapping, bytes, bytearray)) or not isinstance(questions, Iterable):
        raise ConfigError(f"{source}: questions must be a string or a list of strings, records (mappings) and "
                          f"conversations, got {type(questions).__name__}"
                          + (" (for one record, pass [record])" if isinstance(questions, Mapping) else ""))
    rows: list[dict[str, Any]] = []
    numbered: list[int] = []
    name = caller_namer(single)
    for i, q in enumerate(questions):
        if isinstance(q, str):
            rows.append({id_field: str(i), question_field: q})
        elif _is_conversation(q):
            rows.append({id_field: str(i), question_field: [dict(m) for m in q]})
        elif isinstance(q, Mapping):
            rows.append({id_field: str(i), **q})
        else:
            several = single and isinstance(q, (list, tuple))  # submit(["a", "b"]) meant submit_many
            raise ConfigError(f"{source}: {name(i)} must be a string, a record (a mapping) or a conversation (a list "
                              f"of messages), got {type(q).__name__}"
                              + (" (submit takes one question; submit_many and answer take a list)" if several
                                 else ""))
        if not isinstance(q, Mapping) or id_field not in q:  # a string's or a conversation's id is its index
            numbered.append(i)
    _refuse_number_taken(rows, numbered, id_field, source, name)
    for i, row in enumerate(rows):
        try:  # what a question file could not hold is refused here too (a set, a date)
            json.dumps(row)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {name(i)}: {exc}") from None
    return rows


def _table_rows(questions: Any) -> Optional[list[dict[str, Any]]]:
    """A data frame's or a table's rows as records (None for anything else): iterating a pandas
    DataFrame gives its column names and a polars one its columns, each taken for a question;
    a pyarrow Table cannot be iterated. Found by their own methods, so none of them is imported.
    A pandas index with a name (df.set_index("questionID")) is a field of each record too."""
    if callable(getattr(questions, "to_dicts", None)):  # polars
        return list(questions.to_dicts())
    if callable(getattr(questions, "to_pylist", None)) and hasattr(questions, "schema"):  # pyarrow
        return list(questions.to_pylist())
    if callable(getattr(questions, "to_dict", None)) and hasattr(questions, "columns"):  # pandas
        named = any(name is not None for name in getattr(getattr(questions, "index", None), "names", [None]))
        return list((questions.reset_index() if named else questions).to_dict(orient="records"))
    return None


def _is_conversation(q: Any) -> TypeGuard[Sequence[Mapping[str, Any]]]:
    """A list of messages ({role, content} mappings): one question, rendered through the chat
    template (runner/questions/prompts.py conversation)."""
    return isinstance(q, (list, tuple)) and bool(q) and all(isinstance(m, Mapping) for m in q)


def _refuse_number_taken(rows: list[dict[str, Any]], numbered: list[int], id_field: str, source: str,
                         name: Callable[[int], str]) -> None:
    """A question without an id is numbered by its index, so a mix of questions with and without
    ids is refused whatever the ids: a number could be another question's id, and which mixes
    passed would depend on the values. One whose number another question gives as its own id is
    said so, not blamed as a duplicate of an id the caller wrote once."""
    if not numbered or len(numbered) == len(rows):
        return
    advice = f"give every question its {id_field}, or none"
    without = set(numbered)
    given = {str(row[id_field]): i for i, row in enumerate(rows) if i not in without}
    for i in numbered:
        if str(i) in given:
            raise InputError(f"{source}: {name(i)} has no {id_field}, so its index, '{i}', is its id, which "
                             f"{name(given[str(i)])} gives as its own: {advice}")
    first_given = next(i for i in range(len(rows)) if i not in without)
    raise InputError(f"{source}: {name(numbered[0])} has no {id_field}, and {name(first_given)} has one: {advice}")


def caller_records(rows: list[dict[str, Any]], id_field: str, question_field: Optional[str], source: str,
                   single: bool = False) -> list[Record]:
    """The rows as checked records, ids unique."""
    records: list[Record] = []
    seen: dict[str, int] = {}
    name = caller_namer(single)
    for i, row in enumerate(rows):
        rec = record_at(f"{source}: {name(i)}", i + 1, row, id_field, question_field)
        if rec.qid in seen:
            raise InputError(f"{source}: duplicate {id_field}: '{rec.qid}' (questions[{seen[rec.qid]}] and [{i}])")
        seen[rec.qid] = i
        records.append(rec)
    return records


def caller_texts(texts: Union[str, Iterable[str]], where: str) -> list[str]:
    """Pool.tokenize's texts: one string is one text (as answer()'s one question is one question,
    not its characters), and each must be a string (a number was an AttributeError from inside)."""
    # bytes would be read as ints, and None's TypeError would name no call
    if not isinstance(texts, str) and (isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Iterable)):
        raise ConfigError(f"{where}: texts must be a string or a list of strings, got {type(texts).__name__}")
    texts = [texts] if isinstance(texts, str) else list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ConfigError(f"{where}: texts[{bad}] must be a string, got {type(texts[bad]).__name__}")
    return texts


def caller_namer(single: bool) -> Callable[[int], str]:
    """How an error names the caller's question i: by its index in the list, or, where the
    caller gave one question, by the argument's name."""
    return (lambda i: "question") if single else (lambda i: f"questions[{i}]")


def check_vocabulary(question: MadeQuestion, n_vocab: int, where: str) -> None:
    """Hand-made tokens are the model's: a token id outside its vocabulary would stop llama_decode
    for the whole batch, or score another token where a one-token continuation is read straight
    from a logits row (a negative id indexes from the row's end), or reach past the candidates
    in llama.cpp's logit_bias sampler."""
    bias = array("i", [t for t, _ in question.generation.logit_bias] if question.generation else [])
    parts = [("prompt", question.tokens), *((f"continuation {i}", c) for i, c in enumerate(question.continuations)),
             ("logit_bias", bias)]
    for part, tokens in parts:
        if len(tokens) and not (0 <= min(tokens) and max(tokens) < n_vocab):
            bad = next(t for t in tokens if not 0 <= t < n_vocab)
            raise InputError(f"{where}: question {quote(question.qid)}: its {part} has token {bad}, which is not "
                             f"in the model's vocabulary (ids 0-{n_vocab - 1})")
