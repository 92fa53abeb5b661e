"""`ggbatch merge`: the answers files of a sharded job (runner/files/shards.py) joined into one.

    PART... ─▶ read_part (runner/merge/parts.py) ─▶ merge_rows: by id, in the question file's order ─▶ OUT
                                               (duplicates refused, unknown ids refused, missing named)

Rows are written as a run writes them, and an OpenAI Batch output line is kept as it is. So,
merged in the parts' own format, OUT is the file one unsharded run writes: byte for byte for
JSON, JSON Lines and CSV when answers do not depend on their batch (--batch-invariant), line for
line for OpenAI Batch output (whose ids and `created` say when each answer was made). JSON, JSON
Lines and CSV convert into each other, into what a run writing OUT's format writes for the same
answers: a CSV part's cells read back as the lists and objects a run encodes there
(runner/files/formats/cells.py), OUT's columns the run's (run_spec). OpenAI Batch output does not
convert (its lines hold token counts and ids only a run knows). A question no part holds is
written as a run that ended early writes it, `"answer": null` and why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, TypeVar, Union

from ..config.checks import LOGLIKELIHOOD
from ..errors import InputError, quote
from ..files.formats.openai_output import batch_line
from ..files.formats.record import INTEGER
from ..files.formats.rows import OutputSpec, Row, not_answered, row_fields
from ..files.outputs import RowText
from .parts import Part, PartRow

V = TypeVar("V")

MISSING = not_answered("no part holds this question")


@dataclass(frozen=True)
class Merged:
    rows: list[tuple[str, Optional[PartRow]]]  # (id, its row; None when no part holds it), in order

    @property
    def missing(self) -> list[str]:
        return [qid for qid, row in self.rows if row is None]

    @property
    def failed(self) -> int:
        return sum(row is not None and not row.answered for _, row in self.rows)


def merge_rows(parts: Sequence[Part], order: Optional[Sequence[str]] = None, questions: str = "") -> Merged:
    """The parts' rows by id: in `order` (the question file's ids) when given, else in the parts'
    order. An id in two parts, or not in the question file, is an InputError naming its lines."""
    rows: dict[str, PartRow] = {}
    for part in parts:
        own: set[str] = set()  # this part's ids: one twice in it is no matter of two parts
        for row in part.rows:
            if row.qid in own:
                raise InputError(f"id {quote(row.qid)} appears twice in {part.path}, at {_places(rows[row.qid], row)}")
            if row.qid in rows:
                raise InputError(f"id {quote(row.qid)} is in two parts: {rows[row.qid].where} and {row.where} "
                                 "(a part given twice, or parts of two different splits?)")
            rows[row.qid] = row
            own.add(row.qid)
    if order is None:
        return Merged(list(rows.items()))
    known = set(order)
    for row in rows.values():
        if row.qid not in known:
            raise InputError(f"{row.where}: id {quote(row.qid)} is not in the question file {questions}")
    return Merged([(qid, rows.get(qid)) for qid in order])


def _line(row: PartRow) -> str:
    return row.where.rpartition(":")[2]  # where: file:line


def _places(first: PartRow, second: PartRow) -> str:
    """Where two rows of one part are: their lines, or, on one line (a JSON array written on one),
    their places in the array."""
    if _line(first) != _line(second):
        return f"lines {_line(first)} and {_line(second)}"
    return f"items {first.item} and {second.item} of the array (both on line {_line(first)})"


def render_merged(merged: Merged, fmt: str, id_field: str = "questionID", columns: Sequence[str] = (),
                  started: float = 0.0, settings: Optional[Mapping[str, Any]] = None,
                  integer_ids: Optional[bool] = None) -> str:
    """OUT's text in `fmt`: OpenAI Batch output lines as they are; fields as a run writing `fmt`
    writes them (runner/files/outputs.py RowText; a CSV part's cells were decoded as it was read).
    `columns`: a CSV part's header; `settings`: the job's, from a part's journal (part_settings);
    `started`: the time of an OpenAI Batch line written for a missing question; `integer_ids`:
    whether every id of the question file is a JSON integer, as a run writes them then (None: as
    the parts' rows are, all integers or not), for every row, a missing question's too."""
    if fmt == "openai":
        spec = OutputSpec("openai", started=started)
        return "".join((_held(row.line, row) if row is not None
                        else json.dumps(batch_line(Row(qid, None, MISSING), spec), ensure_ascii=False)) + "\n"
                       for qid, row in merged.rows)
    fields = [dict(_held(row.fields, row)) if row is not None else row_fields(Row(qid, None, MISSING), id_field, False)
              for qid, row in merged.rows]
    if integer_ids is None:
        integer_ids = all(type(f[id_field]) is int for f, (_, row) in zip(fields, merged.rows) if row is not None)
    for f in fields:
        f[id_field] = _id_as(str(f[id_field]), integer_ids)
    text = RowText(run_spec(fmt, id_field, fields, columns, settings))
    text.columns += [c for c in _columns(fields, columns) if c not in text.columns]
    return text.head() + "".join(text.fields(f) for f in fields) + text.tail()


def run_spec(fmt: str, id_field: str, fields: Sequence[Mapping[str, Any]], columns: Sequence[str] = (),
             settings: Optional[Mapping[str, Any]] = None) -> OutputSpec:
    """The spec of a run of the job writing `fmt`, as far as the parts tell: a CSV column for each
    kind of field a row holds, a CSV part's header names, or the job's settings ask for (choice
    log-probabilities where no answer could have any). Thinking kept where no answer had any
    leaves no trace but a CSV part's column."""
    has = set(columns) | _asked(settings or {})
    has |= {key for f in fields for key, value in f.items() if value is not None}
    samples = "samples" in has or any(isinstance(f.get("answer"), list) for f in fields)
    return OutputSpec(fmt, id_field, keep_thinking="thinking" in has, choice_logprobs="choice_logprobs" in has,
                      token_logprobs="token_logprobs" in has, answer_norm="answer_norm" in has, samples=samples)


def _asked(settings: Mapping[str, Any]) -> set[str]:
    """The fields a job's settings (its journal's fingerprint: runner/journal/journal.py) ask its
    answers to carry, as runner/job.py gives them CSV columns."""
    answer, n = settings.get("answer"), settings.get("sampling.n")
    asked = {"choice_logprobs"} if isinstance(answer, dict) and answer.get("logprobs") else set()
    asked |= {"token_logprobs"} if settings.get("answer.token_logprobs") is not None else set()
    asked |= {"answer_norm"} if settings.get("answer.choice_scoring") == LOGLIKELIHOOD else set()
    return asked | ({"samples"} if isinstance(n, int) and n > 1 else set())


def _id_as(qid: str, integer_ids: bool) -> Union[int, str]:
    """An id as a run writes it: a JSON integer while every id is one (runner/job.py), else text
    ("007" stays text)."""
    return int(qid) if integer_ids and INTEGER.fullmatch(qid) else qid


def _held(value: Optional[V], row: PartRow) -> V:
    """A row's line (an OpenAI Batch part) or fields (the others): its part's reader always sets it."""
    if value is None:
        raise InputError(f"{row.where}: a row without its content")
    return value


def _columns(fields: Sequence[Mapping[str, Any]], header: Sequence[str]) -> list[str]:
    """A CSV part's columns, then any other field, in the order first seen (the run's own
    columns come first: RowText's)."""
    columns = list(header)
    for f in fields:
        columns += [k for k in f if k not in columns]
    return columns
