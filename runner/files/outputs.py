"""Merging answers back into input order and writing the answers file atomically, in its format
(runner/files/formats: a JSON array, JSON Lines, CSV, or OpenAI Batch output). Rows are written as
they come (a file of millions of answers is never one string in memory): each format's text is
a head, one piece per row, and a tail (RowText, through formats/answers_text.py)."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping, Optional, Sequence

from ...workers.protocol import Answer
from ..errors import OutputError
from .formats.answers_text import TEXT_FORMATS
from .formats.cells import csv_columns
from .formats.detect import errors_format
from .formats.openai_output import batch_line
from .formats.rows import NOT_ANSWERED, OutputSpec, Row, row_fields
from .paths import ERRORS_OUTPUT

ANSWERS = "the answers file"  # what an AtomicFile's error calls its file when not told
TEMP_SUFFIX = ".tmp"  # of the copy an AtomicFile writes beside its target, named .NAME.XXXXXXXX.tmp


def answer_rows(ids: Iterable[str], answers: Mapping[str, Answer], aliases: Optional[Mapping[str, str]] = None,
                unanswered: str = NOT_ANSWERED) -> list[Row]:
    """One row per input id, in input order. `aliases` maps a question id to the id whose answer
    it shares (identical prompts are answered once); a question without an answer gets
    `unanswered` as its error."""
    rows = []
    for qid in ids:
        answer = answers.get((aliases or {}).get(qid, qid))
        rows.append(Row(qid, answer, unanswered if answer is None else answer.error))
    return rows


def merge(ids: Sequence[str], answers: Mapping[str, Answer],
          aliases: Optional[Mapping[str, str]] = None, id_field: str = "questionID",
          keep_thinking: bool = False, unanswered: str = NOT_ANSWERED) -> list[dict[str, Any]]:
    """answer_rows as the fields of a JSON or CSV answers file ({id, "answer", "error"?}); a
    reasoning model's `<think>` block is taken out of the answer (kept as "thinking" if asked)."""
    return [row_fields(row, id_field, keep_thinking) for row in answer_rows(ids, answers, aliases, unanswered)]


class RowText:
    """An answers file's text in one format, a row at a time: head(), row()..., tail(); the
    format's own text from formats/answers_text.py."""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec
        self.text = TEXT_FORMATS[spec.format]
        self.columns = csv_columns(spec)
        self.rows = 0

    def head(self) -> str:
        return self.text.head(self.columns)

    def row(self, row: Row) -> str:
        if self.spec.format == "openai":  # a line of its own kind, not the fields of an answers row
            return self.fields(batch_line(row, self.spec))
        fields = row_fields(row, self.spec.id_field, self.spec.keep_thinking)
        if self.spec.integer_ids:
            fields[self.spec.id_field] = int(row.qid)
        return self.fields(fields)

    def fields(self, fields: Mapping[str, Any]) -> str:
        """A row given as the fields of an answers row (row_fields), or an OpenAI Batch output
        line; a CSV row's cells are those under self.columns."""
        self.rows += 1
        return self.text.row(fields, self.columns, first=self.rows == 1)

    def tail(self) -> str:
        return self.text.tail(self.rows)


def render(rows: Iterable[Row], spec: OutputSpec) -> str:
    """The answers file's text in spec.format."""
    return "".join(_pieces(rows, RowText(spec)))


def _pieces(rows: Iterable[Row], text: RowText) -> Iterator[str]:
    yield text.head()
    for row in rows:
        yield text.row(row)
    yield text.tail()


def write_answers(path: str, rows: Iterable[Row], spec: OutputSpec, errors_path: Optional[str] = None) -> None:
    """The answers file, atomically, written as the rows come. With `errors_path` the rows
    without an answer go there instead, in its own extension's format (detect.py errors_format;
    as OpenAI splits a batch into an output and an error file); each file in input order, the
    errors file written even when empty (never a stale one): valid in its format all the same."""
    if errors_path is None:
        with AtomicFile(path, ANSWERS) as out:
            for piece in _pieces(rows, RowText(spec)):
                out.write(piece)
        return
    with AtomicFile(path, ANSWERS) as out, AtomicFile(errors_path, ERRORS_OUTPUT) as errors:
        answered = RowText(replace(spec, errors_apart=True))
        failed = RowText(replace(spec, format=errors_format(errors_path, spec.format)))
        out.write(answered.head())
        errors.write(failed.head())
        for row in rows:
            if row.error is None:
                out.write(answered.row(row))
            else:
                errors.write(failed.row(row))
        out.write(answered.tail())
        errors.write(failed.tail())


def write_atomic(path: str, text: str | bytes, role: str = ANSWERS) -> None:
    """Write to a temporary file beside the target, then rename: readers never see half a file.
    A symlink is followed: the file it points to is replaced and the link stays a link. `role`
    says what the file is to the command, as paths.check_writable's does, for the error. Bytes
    (a picture) are written as they are, text as UTF-8."""
    with AtomicFile(path, role, binary=isinstance(text, bytes)) as out:
        out.write(text)


class AtomicFile:
    """A file written beside its target and renamed over it when the block ends without an
    error, fsynced first; after an error the target is left as it was. A symlink is followed:
    the file it points to is replaced and the link stays a link. `binary`: written bytes, not text."""

    def __init__(self, path: str, role: str = ANSWERS, binary: bool = False) -> None:
        self.path, self.role, self.binary = path, role, binary
        self.target = Path(os.path.realpath(path))
        self._tmp = ""
        self._file: Optional[IO[Any]] = None

    def __enter__(self) -> "AtomicFile":
        mode = _mode_for(self.target)
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.target.name}.", suffix=TEMP_SUFFIX,
                                             dir=self.target.resolve().parent)
            os.fchmod(fd, mode)  # mkstemp's 0600 would hide the answers from the pipeline's other users
            # newline="": the text is written as made (CSV's quoted line breaks stay as they are)
            self._file = os.fdopen(fd, "wb") if self.binary else os.fdopen(fd, "w", encoding="utf-8", newline="")
        except OSError as exc:
            self._fail(exc)
        return self

    def _opened(self) -> IO[Any]:
        if self._file is None:
            raise RuntimeError(f"{self.target}: written outside its with block")
        return self._file

    def write(self, text: str | bytes) -> None:
        try:
            self._opened().write(text)
        except OSError as exc:
            self._fail(exc)

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None:
            self._discard()
            return
        try:
            file = self._opened()
            file.flush()
            os.fsync(file.fileno())
            file.close()
            os.replace(self._tmp, self.target)
        except OSError as error:
            self._fail(error)

    def _fail(self, exc: OSError) -> None:
        self._discard()
        raise OutputError(f"{self.path}: could not write {self.role}: {exc.strerror or exc}") from None

    def _discard(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        if self._tmp:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass
            self._tmp = ""


def remove_stale_copies(path: str) -> None:
    """Remove the temporary copies of `path` a killed writer left beside it (AtomicFile's, each as
    large as the file: a kill -9 between its making and its rename). Only for a caller holding the
    output's lock (runner/files/lock.py), when no other writer of it can be at work."""
    target = Path(os.path.realpath(path))
    stale = re.compile(re.escape(f".{target.name}.") + r"[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    for name in filter(stale.fullmatch, names):
        try:
            os.unlink(target.parent / name)
        except OSError:
            pass


def _mode_for(target: Path) -> int:
    """The permissions a plain open(target, "w") would leave: the file's own if it exists,
    otherwise 0666 less the umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        umask = os.umask(0)  # the only way to read it; set straight back
        os.umask(umask)
        return 0o666 & ~umask
