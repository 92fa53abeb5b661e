"""The parts `ggbatch merge` joins: answers files of every output format, read as rows keyed by
question id, each named by its file and line.

    a JSON array, JSON Lines   {id, "answer", "error"?, "thinking"?} as written   fields
    CSV                        the same fields, its cells decoded (cells.py)      fields
    OpenAI Batch output        one line per request, keyed by its custom_id       the line, as it is

Each part's journal (beside it, as a run leaves it) says what job made it: part_settings.

The format is the file's extension checked against its content (runner/files/formats/detect.py); JSON
Lines whose first line is an OpenAI Batch output line ({"custom_id", "response", "error"}) are
OpenAI Batch output. The parsing is the question reader's and the scorer's (line numbers,
U+2028-safe line splitting, CSV rows named by the line they start on).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ..errors import InputError
from ..files.formats.cells import csv_fields
from ..files.formats.detect import is_openai_output
from ..files.formats.table_rows import table_rows
from ..files.inputs import detect_format, json_lines, read_text
from ..files.paths import journal_of
from ..files.shards import Shard, parse_shard
from ..journal.ran import legacy_ran, ran_problem, read_ran
from ..scoring.files import openai_text, row_id


def part_settings(path: str) -> Optional[dict[str, Any]]:
    """The settings a part was answered with: its journal's fingerprint (runner/journal/journal.py),
    normalised by a JSON round trip and without its shard, which differs between the shards of one
    job by design; None when the part has no readable journal beside it (a part copied alone)."""
    try:
        with open(journal_of(path), "rb") as f:
            return _settings(f.readline())
    except OSError:
        return None


def part_shard(path: str) -> Optional[Shard]:
    """The shard a part's run answered, as its journal says it; None when it does not say (no
    journal beside it, an unsharded run's, one not readable)."""
    try:
        with open(journal_of(path), "rb") as f:
            spec = (_fingerprint(f.readline()) or {}).get("shard")
        return parse_shard(spec, {}) if isinstance(spec, str) and spec.strip() != "auto" else None
    except (OSError, ValueError):
        return None


def _settings(header_line: bytes) -> Optional[dict[str, Any]]:
    """part_settings from a journal's first line, as read."""
    fingerprint = _fingerprint(header_line)
    if fingerprint is None:
        return None
    settings: dict[str, Any] = json.loads(json.dumps(fingerprint))
    settings.pop("shard", None)
    return settings


def _fingerprint(header_line: bytes) -> Optional[dict[str, Any]]:
    try:
        header = json.loads(header_line)
    except ValueError:
        return None
    fingerprint = header.get("fingerprint") if isinstance(header, dict) else None
    return fingerprint if isinstance(fingerprint, dict) else None


def part_ran(path: str) -> dict[str, Any]:
    """What a part's run decided on auto (runner/journal/ran.py): each shard decides for itself,
    from the questions it holds; {} when its journal does not say."""
    try:
        with open(journal_of(path), "rb") as f:  # one read: the header, then the ran line
            header = f.readline()
            ran = read_ran(f)
            if ran is None and f.readline():  # answers without a ran line: an older version's
                ran = legacy_ran(_settings(header) or {})
    except OSError:
        return {}
    return ran if isinstance(ran, dict) and ran_problem(ran) is None else {}


@dataclass(frozen=True)
class PartRow:
    qid: str
    where: str  # file:line
    answered: bool  # holds an answer (no error)
    fields: Optional[dict[str, Any]] = None  # json, jsonl, csv
    line: Optional[str] = None  # openai: the output line as it is
    item: int = 0  # json: its place in the array, from 1 (items of one line share `where`)


@dataclass(frozen=True)
class Part:
    path: str
    format: str  # json, jsonl, csv or openai
    rows: list[PartRow]
    columns: tuple[str, ...] = ()  # a CSV part's header

    @property
    def lines(self) -> bool:
        """Whether its rows are OpenAI Batch output lines (kept as they are) rather than fields."""
        return self.format == "openai"


def read_part(path: str, id_field: str = "questionID") -> Part:
    """Every row of an answers file, in file order (duplicates are merge_rows' to find)."""
    text = read_text(path)
    fmt = part_format(path, text)
    if fmt == "openai":
        return Part(path, fmt, list(_openai_rows(path, text)))
    items = table_rows(path, text, fmt, finite=False, required={id_field: "--id-field"})
    if fmt == "csv":
        rows = [_row(f"{path}:{line}", csv_fields(f"{path}:{line}", row, id_field), id_field) for line, row in items]
        return Part(path, fmt, rows, tuple(next(csv.reader(io.StringIO(text, newline="")), [])))
    return Part(path, fmt, [_row(f"{path}:{line}", obj, id_field, item)
                            for item, (line, obj) in enumerate(items, start=1)])


def part_format(path: str, text: str) -> str:
    """json, jsonl, csv or openai (OpenAI Batch output lines)."""
    fmt = detect_format(path, text)
    if fmt == "jsonl":
        first = next((line for line in text.split("\n") if line.strip()), "")
        try:
            obj = json.loads(first)
        except ValueError:
            return fmt  # json_lines names the line
        if is_openai_output(obj):
            return "openai"
    return fmt


def _row(where: str, obj: Any, id_field: str, item: int = 0) -> PartRow:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: each answer must be a JSON object, got {type(obj).__name__}")
    answered = obj.get("answer") is not None and not obj.get("error")
    return PartRow(row_id(where, obj, id_field), where, answered, fields=obj, item=item)


def _openai_rows(path: str, text: str) -> Iterable[PartRow]:
    lines = text.split("\n")  # as json_lines splits: its line numbers index this
    for number, obj in json_lines(path, text, finite=False):
        where = f"{path}:{number}"
        if not isinstance(obj, dict):
            raise InputError(f"{where}: each line of OpenAI Batch output must be a JSON object, "
                             f"got {type(obj).__name__}")
        yield PartRow(row_id(where, obj, "custom_id"), where, openai_text(obj) is not None,
                      line=lines[number - 1].rstrip("\r"))
