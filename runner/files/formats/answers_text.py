"""The text of an answers file in each format ggbatch writes, a row at a time: a head, one piece
per row, a tail. A row comes as its fields (formats/rows.py row_fields; an OpenAI Batch output
line is one object too), so a file of millions of answers is never one string in memory
(runner/files/outputs.py RowText writes them as they come)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Protocol, Sequence

from .cells import csv_cells
from .csvfile import csv_line


class TextFormat(Protocol):
    def head(self, columns: Sequence[str]) -> str:
        """What comes before the first row; `columns`: a CSV file's header (cells.csv_columns)."""

    def row(self, fields: Mapping[str, Any], columns: Sequence[str], first: bool) -> str:
        """One row's text."""

    def tail(self, rows: int) -> str:
        """What comes after the last of `rows` rows."""


class JsonArray:
    """`[`, one object a row (json_element's layout), `]`; no rows is `[]`."""

    def head(self, columns: Sequence[str]) -> str:
        return ""  # the bracket comes with the first row: an empty file is `[]`

    def row(self, fields: Mapping[str, Any], columns: Sequence[str], first: bool) -> str:
        return ("[\n" if first else ",\n") + json_element(fields)

    def tail(self, rows: int) -> str:
        return "\n]\n" if rows else "[]\n"


class JsonLines:
    """One compact object a line: JSON Lines, and OpenAI Batch output."""

    def head(self, columns: Sequence[str]) -> str:
        return ""

    def row(self, fields: Mapping[str, Any], columns: Sequence[str], first: bool) -> str:
        return json.dumps(fields, ensure_ascii=False) + "\n"

    def tail(self, rows: int) -> str:
        return ""


class CsvTable:
    """A header row, then a row's cells (cells.csv_cells) under the header's columns."""

    def head(self, columns: Sequence[str]) -> str:
        return csv_line(columns)

    def row(self, fields: Mapping[str, Any], columns: Sequence[str], first: bool) -> str:
        cells = csv_cells(fields)
        return csv_line(["" if cells.get(c) is None else cells[c] for c in columns])

    def tail(self, rows: int) -> str:
        return ""


# the answers file's format (detect.py output_format) -> its text
TEXT_FORMATS: dict[str, TextFormat] = {"json": JsonArray(), "jsonl": JsonLines(), "openai": JsonLines(),
                                       "csv": CsvTable()}


def json_element(fields: Mapping[str, Any]) -> str:
    """One row of a JSON answers file, laid out as json.dumps(rows, indent=1) lays out an array's
    element except below a field: a list is opened while its items are lists, and each item that
    is not a list is written compact on a line of its own; a field's object has a key a line. A
    token's log-probability entry is then one line, where indent gives it dozens (a line per byte
    of its text) and only Python's slower encoder can write it (json's C encoder cannot indent:
    0.11 s for W1's 2,048 tokens with their top 5, against 0.02 s)."""
    if not fields:
        return " {}"
    return " {\n" + ",\n".join(f"  {_compact(key)}: {_laid_out(value, 2)}" for key, value in fields.items()) + "\n }"


def _laid_out(value: Any, depth: int) -> str:
    """A value json_element writes at this depth (its closing bracket indented by depth)."""
    if isinstance(value, list) and value:
        items = [_laid_out(item, depth + 1) if isinstance(item, list) else _compact(item) for item in value]
    elif isinstance(value, dict) and value and depth == 2:
        items = [f"{_compact(key)}: {_compact(item)}" for key, item in value.items()]
    else:
        return _compact(value)
    inner, brackets = " " * (depth + 1), "[]" if isinstance(value, list) else "{}"
    return brackets[0] + "\n" + ",\n".join(inner + item for item in items) + "\n" + " " * depth + brackets[1]


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
