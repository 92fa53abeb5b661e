"""An answers row's fields as CSV cells, and back: the one place that says how the fields of a
JSON answers row ({id, "answer", ...}, rows.py row_fields) become the cells of a CSV answers row,
for a run writing CSV and for `ggbatch merge` converting between formats.

    JSON, JSON Lines                    CSV
    "answer": [samples]                 answer: the list as JSON text; samples: how many
    "thinking": [one per sample]        thinking: the list as JSON text (a row with samples)
    "choice_logprobs": {choice: lp}     choice_logprobs: JSON text
    "token_logprobs": [...]             token_logprobs: JSON text
    "answer": null, "error": why        answer empty, error: why
    a text                              the text, as it is (an empty cell: none)

Read back, only those cells are decoded, and "answer" and "thinking" only in a row whose samples
cell is set: an answer, or a column ggbatch does not write, that happens to look like JSON stays
the text it is.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from ...errors import ConfigError, InputError, quote
from .rows import OutputSpec

# The fields of an answers row after its id, in the order row_fields writes them
FIELDS = ("answer", "answer_norm", "thinking", "choice_logprobs", "token_logprobs", "error")
# Every field an answers row may hold beside its id: row_fields' and CSV's count of samples
OWN_COLUMNS = FIELDS + ("samples",)
# CSV columns holding JSON text whenever they are set, and what that text holds
JSON_TEXT = {"choice_logprobs": dict, "token_logprobs": list}
# ... and only in a row with samples
SAMPLE_TEXT = {"answer": list, "thinking": list}


def csv_columns(spec: OutputSpec) -> list[str]:
    """The columns of a CSV answers file written to `spec`, in order."""
    columns = [spec.id_field, "answer"] + (["answer_norm"] if spec.answer_norm else [])
    columns += [] if spec.errors_apart else ["error"]
    columns += ["thinking"] if spec.keep_thinking else []
    return columns + [key for key in ("choice_logprobs", "token_logprobs", "samples") if getattr(spec, key)]


def check_id_column(id_field: str, formats: Iterable[str], flag: str = "--id-field") -> None:
    """Refuse an id field named as a field the answers rows write themselves (`answer`, `error`,
    ...): in JSON the row's own value would replace the id, in CSV the header would name the column
    twice, and no answer could be matched to its question. OpenAI Batch output keys its lines by
    custom_id, so only the other `formats` (the answers file's, an errors file's) can clash."""
    if id_field in OWN_COLUMNS and any(fmt != "openai" for fmt in formats):
        raise ConfigError(f"fields.id ({flag}): {quote(id_field)} is one of the fields ggbatch writes in answers "
                          f"rows ({', '.join(OWN_COLUMNS)}): the ids would be overwritten and no answer could be "
                          "matched to its question; rename that field in the question file")


def csv_cells(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A row's fields as CSV cells: lists and objects as JSON text, and a row with samples (its
    answer a list) says how many in `samples`."""
    cells = {key: json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else value
             for key, value in fields.items()}
    if isinstance(fields.get("answer"), list):
        cells["samples"] = len(fields["answer"])
    return cells


def csv_fields(where: str, row: Mapping[str, str], id_field: str) -> dict[str, Any]:
    """A CSV answers row as the fields the same row has in JSON: csv_cells undone, in row_fields'
    order. A failed row (its error set) has `"answer": null`; an empty cell of a column ggbatch
    writes is no field; a column it does not write is kept as its text."""
    cells = dict(row)
    sampled = bool(cells.pop("samples", "").strip())
    fields: dict[str, Any] = {id_field: cells.pop(id_field)} if id_field in cells else {}
    for key in FIELDS:
        if key not in cells:
            continue
        text = cells.pop(key)
        if key == "answer":
            fields[key] = _decoded(where, key, text, list) if sampled else text
        elif text:
            kind = JSON_TEXT.get(key) or (SAMPLE_TEXT.get(key) if sampled else None)
            fields[key] = text if kind is None else _decoded(where, key, text, kind)
    if fields.get("error"):
        fields["answer"] = None
    return {**fields, **cells}


def _decoded(where: str, column: str, text: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, kind):
        raise InputError(f"{where}: column '{column}' holds {quote(_clipped(text))}, not the JSON "
                         f"{kind.__name__} ggbatch writes there")
    return value


def _clipped(text: str, most: int = 60) -> str:
    return text if len(text) <= most else text[:most] + "..."

