"""`ggbatch merge`: the answers files of a sharded job (runner/files/shards.py) joined into one.

    PART... ─▶ read_part (runner/merge/parts.py) ─▶ merge_rows: by id, in the question file's order ─▶ OUT
                                               (duplicates refused, unknown ids refused, missing named)

Rows are written as a run writes them, and an OpenAI Batch output line is kept as it is. So,
merged in the parts' own format, OUT is the file one unsharded run writes: byte for byte for
JSON, JSON Lines and CSV when answers do not depend on their batch (--batch-invariant), line for
line for OpenAI Batch output (whose ids and `created` say when each answer was made). JSON, JSON
Lines and CSV convert into each other; OpenAI Batch output does not (its lines hold token counts
and ids only a run knows). A question no part holds is written as a run that ended early writes
it, `"answer": null` and why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence, TypeVar

from ..errors import InputError, quote
from ..files.formats.csvfile import render_csv
from ..files.formats.jsonfile import render_json
from ..files.formats.openai_output import batch_line
from ..files.formats.rows import OutputSpec, Row, row_fields
from .parts import Part, PartRow

V = TypeVar("V")

MISSING = "not answered: no part holds this question"


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
        for row in part.rows:
            if row.qid in rows:
                raise InputError(f"id {quote(row.qid)} is in two parts: {rows[row.qid].where} and {row.where} "
                                 "(a part given twice, or parts of two different splits?)")
            rows[row.qid] = row
    if order is None:
        return Merged(list(rows.items()))
    known = set(order)
    for row in rows.values():
        if row.qid not in known:
            raise InputError(f"{row.where}: id {quote(row.qid)} is not in the question file {questions}")
    return Merged([(qid, rows.get(qid)) for qid in order])


def render_merged(merged: Merged, fmt: str, id_field: str = "questionID", columns: Sequence[str] = (),
                  started: float = 0.0) -> str:
    """OUT's text in `fmt`: OpenAI Batch output lines as they are; fields as a run writes them.
    `columns`: a CSV part's header (else the id, answer, error and any other fields'); `started`:
    the time of an OpenAI Batch line written for a missing question."""
    if fmt == "openai":
        spec = OutputSpec("openai", started=started)
        return "".join((_held(row.line, row) if row is not None
                        else json.dumps(batch_line(Row(qid, None, MISSING), spec), ensure_ascii=False)) + "\n"
                       for qid, row in merged.rows)
    fields = [_held(row.fields, row) if row is not None else row_fields(Row(qid, None, MISSING), id_field, False)
              for qid, row in merged.rows]
    if fmt == "csv":
        return render_csv(fields, columns or _columns(fields, id_field))
    return render_json(fields, lines=fmt == "jsonl")


def _held(value: Optional[V], row: PartRow) -> V:
    """A row's line (an OpenAI Batch part) or fields (the others): its part's reader always sets it."""
    if value is None:
        raise InputError(f"{row.where}: a row without its content")
    return value


def _columns(fields: Sequence[dict[str, Any]], id_field: str) -> list[str]:
    """The columns a run writes (id, answer, error), then any other field, in the order first seen."""
    columns = [id_field, "answer", "error"]
    for f in fields:
        columns += [k for k in f if k not in columns]
    return columns
