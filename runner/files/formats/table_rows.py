"""The rows of a JSON array, JSON Lines or CSV file, each with the line it starts on: answers
files (ggbatch merge's parts) and gold files (ggbatch score) are read through the question
reader's own parsers, with its line numbers and refusals."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional

from .csvfile import csv_rows
from .jsonfile import json_array, json_lines

Rows = Iterator[tuple[int, Any]]
# format -> its reader: (path, text, finite, required) -> rows; `finite`: NaN and Infinity
# refused (ggbatch's own answers may hold a logprob of -Infinity); `required`: columns a CSV
# header must name, each with the setting that names it
_READERS: dict[str, Callable[[str, str, bool, Mapping[str, str]], Rows]] = {
    "json": lambda path, text, finite, required: json_array(path, text, finite),
    "jsonl": lambda path, text, finite, required: json_lines(path, text, finite),
    "csv": lambda path, text, finite, required: csv_rows(path, text, required),
}


def table_rows(path: str, text: str, fmt: str, finite: bool = True,
               required: Optional[Mapping[str, str]] = None) -> Rows:
    """(line, row) of the file's text in `fmt` (json, jsonl or csv); a CSV row is {column: cell}."""
    return _READERS[fmt](path, text, finite, required or {})
