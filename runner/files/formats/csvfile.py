"""CSV question files and answers files, as Python's csv module reads and writes them (the Excel
dialect: double quotes, fields quoted when they hold a delimiter, a quote or a line break). Answers
are written with commas; a file read may be delimited by commas, semicolons, tabs or bars (the
header row tells which), its rows ended by LF, CRLF or CR.

A question file has a header row naming the columns; `fields.id` and `fields.question` pick two
of them, and every column is a field prompt.template may use. Empty column names at the end of
the header, and rows whose cells are all empty, are what spreadsheets add: they are left out. A
record that spans several lines (a quoted field with line breaks) is named by the line it starts on.
"""

from __future__ import annotations

import csv
import io
import itertools
import sys
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

from ...errors import InputError, quote
from .likely_fields import field_hint

DELIMITERS = (",", ";", "\t", "|")
# A long passage or document is one field: csv.writer writes fields of any length, and the
# reader's default limit (131,072 characters) would call such a file malformed. The token limit
# per question guards the model. (The C long under csv is 32 bits on some platforms.)
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def csv_rows(path: str, text: Union[str, Iterable[str]],
             required: Optional[Mapping[str, str]] = None) -> Iterator[tuple[int, dict[str, str]]]:
    """(line the row starts on, {column: value}) of each data row; blank lines, and rows whose
    cells are all empty, are skipped. A row with more or fewer fields than the header is an error
    naming its line. `text`: the file's text, or its lines as they are read. `required`: columns
    the header must name (column -> the job key that names it, for the error)."""
    lines = iter(io.StringIO(text, newline="") if isinstance(text, str) else text)
    first = next(lines, "")
    delimiter = header_delimiter(first, required or {})
    reader = csv.reader(itertools.chain([first], lines), delimiter=delimiter, strict=True)
    header, width = _header(path, reader)
    if width:  # a file with a header row (an empty file has none)
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
        if any(cell.strip() for cell in cells):
            yield start, _row(path, start, header, width, cells)


def header_delimiter(line: str, required: Mapping[str, str]) -> str:
    """The delimiter of a header line: of , ; tab and | (a spreadsheet's choices), the one that
    splits it into all the required columns, and the most columns; a comma when none does
    better. Excel writes semicolons where the decimal mark is a comma, tabs as "Unicode text"."""
    split = {d: _cells(line, d) for d in DELIMITERS}
    fitting = [d for d in DELIMITERS if all(column in split[d] for column in required)] or DELIMITERS
    return max(fitting, key=lambda d: len(split[d]))  # the first of equals: the comma


def _cells(line: str, delimiter: str) -> list[str]:
    try:
        return next(csv.reader([line], delimiter=delimiter), [])
    except csv.Error:  # a header cell with a line break: the first line alone is not a whole row
        return []


def _header(path: str, reader: Any) -> tuple[list[str], int]:
    """The column names, less empty ones at the end of the row (a spreadsheet writes a column
    whose cells were once formatted), and how many cells the row had."""
    try:
        cells: list[str] = next(reader, [])
    except csv.Error as exc:
        raise InputError(f"{path}:1: malformed CSV header: {exc}") from None
    header = list(cells)
    while header and not header[-1].strip():
        header.pop()
    seen: set[str] = set()
    for name in header:
        if not name.strip():
            raise InputError(f"{path}:1: the header row has an empty column name")
        if name in seen:
            raise InputError(f"{path}:1: the header row names column {quote(name)} twice")
        seen.add(name)
    return header, len(cells)


def _row(path: str, line: int, header: list[str], width: int, cells: list[str]) -> dict[str, str]:
    """{column: value}; cells under the header's unnamed columns at the end must be empty."""
    if not len(header) <= len(cells) <= width:
        raise InputError(f"{path}:{line}: {len(cells)} fields where the header (line 1) names "
                         f"{len(header)} columns")
    for column, cell in enumerate(cells[len(header):], start=len(header) + 1):
        if cell.strip():
            raise InputError(f"{path}:{line}: column {column} holds {quote(cell)}, but the header "
                             "(line 1) gives it no name")
    return dict(zip(header, cells))


def _require(path: str, header: Sequence[str], columns: Mapping[str, str]) -> None:
    for column, key in columns.items():
        if column not in header:
            names = ", ".join(map(quote, header[:12]))
            others = [name for name in header if name not in columns]
            raise InputError(f"{path}:1: the header has no column {quote(column)} ({key}); its columns: {names}"
                             f"{field_hint(key, column, others)}")


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
