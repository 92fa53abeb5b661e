"""Reading and checking a question file, whatever its format (runner/files/formats: a JSON array, JSON
Lines, CSV, or OpenAI Batch requests): every record in file order, ids unique, and every problem
an InputError naming the file and line.

Line formats (JSON Lines, CSV, OpenAI Batch) are read a line at a time, so a file of millions of
questions is never in memory whole: `open_question_file` gives its records as an iterator, each
checked as it is read (a problem on line 900,000 is raised when that line is reached). A JSON
array is parsed whole.
"""

from __future__ import annotations

import codecs
import itertools
import json
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from ..errors import InputError, quote
from .compact import HashIndex, key64, text_key
from .formats.csvfile import csv_rows
from .formats.detect import detect_format, input_format, is_openai_output
from .formats.jsonfile import json_array, json_lines, loads
from .formats.likely_fields import field_hint
from .formats.openai_checks import Refused, messages
from .formats.openai_input import OUTPUT_NOT_REQUESTS, openai_record, say_models
from .formats.record import Record, checked_id
from .formats.textfile import decoded, no_binary, no_utf16, open_bytes, read_text, split_lone_cr
from .read_on import FileAtStart, at_start, read_whole

__all__ = ["QuestionFile", "QuestionStream", "Record", "open_question_file", "record_at", "read_question_file",
           "read_records", "read_text", "detect_format", "json_array", "json_lines"]

HEAD_BYTES = 1 << 20  # what format detection reads of a file
UNIQUE_CHUNK = 4096  # records whose ids are checked together
READ_BYTES = 1 << 20  # lines of a JSON Lines file read (and looked up in a resumed journal) together


@dataclass(frozen=True)
class QuestionFile:
    format: str  # json, jsonl, csv or openai
    records: list[Record]


@dataclass
class Known:
    """Lines whose answers are known (runner/journal/journal.py records_known: lines' hashes -> their
    ids, or None): such a line of a JSON Lines file becomes a record without its fields,
    unparsed. Set once the journal is open; a job that needs a reused record's fields
    (answer.choices: auto) leaves it."""

    qids_of: Optional[Callable[[list[int]], list[Optional[str]]]] = None


@dataclass
class QuestionStream:
    format: str
    records: Iterator[Record]  # in file order, each checked (ids unique so far) as it is read
    longest_line: int  # characters of the longest line (a JSON array: of the longest record's text)
    known: Known
    records_guess: int = 0  # about how many records: its lines (a CSV file's less the header); 0: not counted
    # a record read so far, of any shard, has a text id (a JSON string, a CSV cell, a custom_id): the
    # answers file writes every id as text; while none has, JSON integers are written back as such
    text_ids: bool = False  # (set by runner/job.py _read)


def open_question_file(path: str, id_field: str = "questionID", question_field: Optional[str] = "question",
                       fmt: Optional[str] = None) -> QuestionStream:
    """The records of a question file as they are read. `fmt`: the job's input_format (None: by
    extension and content, runner/files/formats/detect.py)."""
    was = at_start(path)  # before its first read: a line file is read on as the run goes
    head = _head(path)
    if fmt in (None, "csv", "json"):  # by extension too (.csv, .json), before its format's reader refuses it
        _no_batch_output(path, head)
    requested, fmt = fmt, input_format(path, head, fmt)
    return _STREAMS[fmt](_Opening(path, was, id_field, question_field, _openai_hint(fmt, requested)))


@dataclass(frozen=True)
class _Opening:
    """A question file to read, its format known: what each format's reader takes."""

    path: str
    was: Optional[FileAtStart]  # the file as its first read found it: a line file is read on as the run goes
    id_field: str
    question_field: Optional[str]
    hint: str  # said of a record without its id that is an OpenAI Batch request (_openai_hint)


def _json_stream(f: _Opening) -> QuestionStream:
    """A JSON array: read whole (one value), each record hashed as its canonical JSON."""
    text = read_text(f.path)
    items = ((line, obj, json.dumps(obj, sort_keys=True).encode()) for line, obj in json_array(f.path, text))
    records = (_record(f.path, line, obj, f.id_field, f.question_field, key64(raw), f.hint)
               for line, obj, raw in items)
    return QuestionStream("json", _unique(f.path, records, f.id_field), max(map(len, text.split("\n")), default=0),
                          Known())


def _openai_stream(f: _Opening) -> QuestionStream:
    models: dict[str, int] = {}  # the models its lines name, said once the whole file is read and checked
    longest, lines = _line_stats(f.path)
    records = _then(_unique(f.path, _openai(f.path, models), "custom_id"), lambda: say_models(f.path, models))
    return QuestionStream("openai", read_whole(f.path, f.was, records), longest, Known(), lines)


def _csv_stream(f: _Opening) -> QuestionStream:
    required = {f.id_field: "fields.id", **({f.question_field: "fields.question"} if f.question_field else {})}
    records = (_record(f.path, line, row, f.id_field, f.question_field, _row_digest(row))
               for line, row in csv_rows(f.path, _csv_lines(f.path), required))
    longest, lines = _line_stats(f.path, csv=True)
    return QuestionStream("csv", read_whole(f.path, f.was, _unique(f.path, records, f.id_field)), longest, Known(),
                          max(lines - 1, 0))


def _jsonl_stream(f: _Opening) -> QuestionStream:
    """JSON Lines: a line the journal already answered is not parsed (Known)."""
    known = Known()
    longest, lines = _line_stats(f.path)
    lines_read = _unique(f.path, _jsonl_records(f.path, f.id_field, f.question_field, known, f.hint), f.id_field)
    return QuestionStream("jsonl", read_whole(f.path, f.was, lines_read), longest, known, lines)


# a question file's format (formats/detect.py input_format) -> its reader
_STREAMS: dict[str, Callable[[_Opening], QuestionStream]] = {
    "json": _json_stream, "openai": _openai_stream, "csv": _csv_stream, "jsonl": _jsonl_stream}


def _no_batch_output(path: str, head: str) -> None:
    """A batch's output file read as CSV or a JSON array is refused as record_at refuses it in the
    other formats, before those readers fail on its first line with messages that do not say why."""
    for number, line in enumerate(head.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            return
        if is_openai_output(obj):
            raise InputError(f"{path}:{number}: {OUTPUT_NOT_REQUESTS}")
        return


def _openai_hint(fmt: str, requested: Optional[str]) -> str:
    """What to do when a record of this format turns out to be an OpenAI Batch request."""
    if fmt == "json":
        return " (an OpenAI Batch request: a file of requests holds one per line, JSON Lines, not an array)"
    if fmt != "jsonl":
        return ""
    if requested is None:
        return (" (an OpenAI Batch request, but the file's first line is not one, so the file is read as "
                "questions: set input_format to openai to read it as requests)")
    return " (an OpenAI Batch request: set input_format to openai)"


def _row_digest(row: dict[str, str]) -> int:
    """A CSV row's hash, of its column names with their values: a rerun after the header was
    relabelled (two columns' names swapped) holds other records, whose prompts are made again."""
    return key64("\x1f".join(f"{name}\x1e{value}" for name, value in row.items()).encode())


def read_question_file(path: str, id_field: str = "questionID", question_field: Optional[str] = "question",
                       fmt: Optional[str] = None) -> QuestionFile:
    """All records of a question file, in file order, validated (ids unique, question text present)."""
    stream = open_question_file(path, id_field, question_field, fmt)
    return QuestionFile(stream.format, list(stream.records))


def read_records(path: str, id_field: str = "questionID", question_field: Optional[str] = "question",
                 fmt: Optional[str] = None) -> list[Record]:
    """All records of a question file, in file order, validated (ids unique, question text present)."""
    return read_question_file(path, id_field, question_field, fmt).records


def _unique(path: str, records: Iterable[Record], id_name: str) -> Iterator[Record]:
    """The records, an InputError at the first id seen
    before, naming both lines. Ids are held as 64-bit keys (runner/files/compact.py): a million of them
    in 16 MB, looked up a chunk of records at a time."""
    seen = HashIndex()
    chunk: list[Record] = []
    for rec in records:
        chunk.append(rec)
        if len(chunk) == UNIQUE_CHUNK:
            yield from _check(path, chunk, seen, id_name)
            chunk = []
    yield from _check(path, chunk, seen, id_name)


def _check(path: str, chunk: list[Record], seen: HashIndex, id_name: str) -> list[Record]:
    earlier = seen.get_many([rec.key for rec in chunk])
    mine: dict[int, int] = {}
    for rec, line in zip(chunk, earlier):
        line = line if line is not None else mine.get(rec.key)
        if line is not None:
            raise InputError(f"{path}: duplicate {id_name}: '{rec.qid}' (lines {line} and {rec.line})")
        mine[rec.key] = rec.line
    seen.add_many(list(mine), list(mine.values()))
    return chunk


def _openai(path: str, models: dict[str, int]) -> Iterator[Record]:
    """The requests; `models`: how many lines name each model."""
    if _head(path).lstrip().startswith("["):
        raise InputError(f"{path}:1: an OpenAI Batch file holds one request per line (JSON Lines), "
                         "not a JSON array")
    for number, text, raw in _json_lines(path):
        rec = openai_record(f"{path}:{number}", number, _json(path, number, text), key64(raw))
        if rec.request is not None and rec.request.model:
            models[rec.request.model] = models.get(rec.request.model, 0) + 1
        yield rec


def _then(records: Iterator[Record], done: Callable[[], None]) -> Iterator[Record]:
    yield from records
    done()


def _jsonl_records(path: str, id_field: str, question_field: Optional[str], known: Known,
                   hint: str) -> Iterator[Record]:
    with open_bytes(path) as f:
        number = 0
        while lines := f.readlines(READ_BYTES):
            digests = [key64(raw) for raw in lines]  # each line as written, its line break too
            qids = known.qids_of(digests) if known.qids_of is not None else [None] * len(lines)
            for raw, digest, qid in zip(lines, digests, qids):
                number += 1
                if qid is not None:  # answered before, exactly as written: not even decoded (a resumed big file)
                    yield Record(qid, {}, number, digest=digest, key=text_key(qid))
                    continue
                text = decoded(path, number, raw)
                if text.strip():
                    yield _record(path, number, _json(path, number, text), id_field, question_field, digest, hint)


def _json_lines(path: str) -> Iterator[tuple[int, str, bytes]]:
    """(line number, text, raw bytes) of each non-blank line."""
    for number, text, raw in _lines(path, keep_raw=True):
        if text.strip():
            yield number, text, raw.strip()


def _json(path: str, number: int, text: str) -> Any:
    # without its line break: an object left open is reported at the end of its own line,
    # not at column 1 of the next (the decoder's line 2)
    return loads(f"{path}:{number}", text.rstrip("\r\n"))


def _lines(path: str, keep_raw: bool = False) -> Iterator[Any]:
    """(number, text) of each line, or (number, text, raw bytes): split on "\\n" only (str's
    splitlines would also split on U+0085 and U+2028 inside strings), decoded as UTF-8 with the
    line and column of a byte that is not."""
    with open_bytes(path) as f:
        for number, raw in enumerate(f, start=1):
            text = decoded(path, number, raw)
            yield (number, text, raw) if keep_raw else (number, text)


def _csv_lines(path: str) -> Iterator[str]:
    """A CSV file's lines, ended by LF, CRLF or a lone CR (Excel for Mac), each decoded."""
    with open_bytes(path) as f:
        for number, raw in enumerate(split_lone_cr(f), start=1):
            yield decoded(path, number, raw)


def _head(path: str) -> str:
    """The start of the file for format detection: its first HEAD_BYTES cut at a line end, or its
    first line whole when that is longer and may be a JSON object (an OpenAI Batch request of a
    long document)."""
    with open_bytes(path) as f:
        data = f.read(HEAD_BYTES)
        body = data.removeprefix(codecs.BOM_UTF8).lstrip()
        if body.startswith(b"{") and b"\n" not in body:
            data += f.readline()
        elif len(data) == HEAD_BYTES and b"\n" in data:
            data = data[:data.rindex(b"\n") + 1]
    no_binary(path, data[:4096])  # before its bytes, decoded with replacements, look like CSV to detection
    # so is UTF-16 without a byte order mark: big-endian starts with a zero byte, not "{" or "[", and
    # its commas made detection call a .jsonl file CSV before the reader could say what it is
    no_utf16(path, data[:4096].split(b"\n", 1)[0])
    return data.decode("utf-8-sig", "replace")


def _line_stats(path: str, csv: bool = False) -> tuple[int, int]:
    """(bytes of the file's longest line, its lines), in one fast pass (a CSV file's lines may end
    in a lone CR). The longest line bounds any one question's text (runner/plan/layout.py guesses
    a streamed file's context from it); the count is about the records, for the progress line."""
    numbers = itertools.count()  # zip draws a number before each line, and one more at the end
    with open_bytes(path) as f:
        lines = map(operator.itemgetter(1), zip(numbers, split_lone_cr(f) if csv else f))
        longest = max(map(len, lines), default=0)  # at C speed: a million lines in about 0.1 s
    return longest, next(numbers) - 1


def _record(path: str, line: int, obj: Any, id_field: str, question_field: Optional[str], digest: int = 0,
            hint: str = "") -> Record:
    return record_at(f"{path}:{line}", line, obj, id_field, question_field, digest, hint)


def record_at(where: str, line: int, obj: Any, id_field: str, question_field: Optional[str], digest: int = 0,
              hint: str = "") -> Record:
    """A question file's record (or a Python caller's: runner/warm/records.py), checked; every
    problem an InputError starting with `where`. `question_field`: the field that must hold the
    question text; None where the job's prompt.template reads other fields only
    (runner/questions/prompts.py question_field_read)."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: each question must be a JSON object, got {type(obj).__name__}")
    if id_field not in obj and is_openai_output(obj):
        raise InputError(f"{where}: {OUTPUT_NOT_REQUESTS}")
    if id_field not in obj:
        likely = field_hint("fields.id", id_field, obj)
        said = hint if hint and "custom_id" in obj else f" (fields.id){_its_fields(obj)}{likely}"
        raise InputError(f"{where}: record has no '{id_field}'{said}")
    qid = obj[id_field]
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise InputError(f"{where}: '{id_field}' must be a string or an integer, got {type(qid).__name__}")
    if question_field is not None:
        _check_question(where, obj, question_field, id_field)
    qid = checked_id(where, str(qid), id_field)
    return Record(qid, obj, line, digest=digest, key=text_key(qid))


def _its_fields(obj: Mapping[str, Any], besides: str = "") -> str:
    """The names a record does have, so a file whose id or question is named otherwise says which."""
    names = [name for name in obj if name != besides]
    shown = ", ".join(map(quote, names[:12])) + (", ..." if len(names) > 12 else "")
    other = " other" if besides else ""
    return f"; its{other} fields: {shown}" if names else f"; it has no{other} fields"


def _check_question(where: str, obj: Mapping[str, Any], question_field: str, id_field: str) -> None:
    if question_field not in obj:
        others = [name for name in obj if name != id_field]
        raise InputError(f"{where}: record has no '{question_field}' (fields.question)"
                         f"{_its_fields(obj, besides=id_field)}{field_hint('fields.question', question_field, others)}")
    question = obj[question_field]
    if isinstance(question, list) and all(isinstance(m, dict) for m in question):
        try:  # a conversation, as a chat line's messages (runner/questions/prompts.py)
            messages(question_field, question)
        except Refused as exc:
            raise InputError(f"{where}: {exc}") from None
        return
    if not isinstance(question, str):
        kind = type(question).__name__
        if isinstance(question, list):  # not every item an object: say what one is
            kind += f" holding {type(next(m for m in question if not isinstance(m, dict))).__name__}"
        raise InputError(f"{where}: '{question_field}' must be a string or a conversation (a list of messages, each "
                         f"an object with a role and a content), got {kind}")
    if not question.strip():
        raise InputError(f"{where}: '{question_field}' is empty")
