"""CSV question files and answers files, as Python's csv module reads and writes them (the Excel
dialect: commas, double quotes, fields quoted when they hold a comma, a quote or a line break).

A question file has a header row naming the columns; `fields.id` and `fields.question` pick two
of them, and every column is a field prompt.template may use. A record that spans several lines
(a quoted field with line breaks) is named by the line it starts on.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

from ..errors import InputError, quote


def csv_rows(path: str, text: Union[str, Iterable[str]],
             required: Optional[Mapping[str, str]] = None) -> Iterator[tuple[int, dict[str, str]]]:
    """(line the row starts on, {column: value}) of each data row; blank lines are skipped. A row
    with more or fewer fields than the header is an error naming its line. `text`: the file's
    text, or its lines as they are read. `required`: columns the header must name (column -> the
    job key that names it, for the error)."""
    reader = csv.reader(io.StringIO(text, newline="") if isinstance(text, str) else text, strict=True)
    header = _header(path, reader)
    if header:
        _require(path, header, required or {})
    before = reader.line_num
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InputError(f"{path}:{before + 1}: malformed CSV: {exc}") from None
        start, before = before + 1, reader.line_num
        if not cells:
            continue
        if len(cells) != len(header):
            raise InputError(f"{path}:{start}: {len(cells)} fields where the header (line 1) names "
                             f"{len(header)} columns")
        yield start, dict(zip(header, cells))


def _header(path: str, reader: Any) -> list[str]:
    try:
        header = next(reader, [])
    except csv.Error as exc:
        raise InputError(f"{path}:1: malformed CSV header: {exc}") from None
    seen: set[str] = set()
    for name in header:
        if not name.strip():
            raise InputError(f"{path}:1: the header row has an empty column name")
        if name in seen:
            raise InputError(f"{path}:1: the header row names column {quote(name)} twice")
        seen.add(name)
    return header


def _require(path: str, header: Sequence[str], columns: Mapping[str, str]) -> None:
    for column, key in columns.items():
        if column not in header:
            names = ", ".join(map(quote, header[:12]))
            raise InputError(f"{path}:1: the header has no column {quote(column)} ({key}); its columns: {names}")


def csv_line(cells: Sequence[Any]) -> str:
    """One CSV record with its line break, as csv.writer writes it."""
    out = io.StringIO(newline="")
    csv.writer(out).writerow(cells)
    return out.getvalue()


def render_csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A header row and one row per answer; None is an empty field."""
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
    return out.getvalue()
