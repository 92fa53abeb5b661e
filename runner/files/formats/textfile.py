"""The bytes of a question file (or an answers or gold file) as text: UTF-8, with or without a
byte order mark, or UTF-16 (or UTF-32) with one: what spreadsheets save as "Unicode text". Every
problem is an InputError naming the file and line.

Line files are read a line at a time as UTF-8 bytes split on "\\n" only (str.splitlines would
also split on U+0085 and U+2028 inside strings): a UTF-16 file is decoded and re-encoded on the
way, so every reader, and the hashes the journal keeps of lines, see one encoding.
"""

from __future__ import annotations

import codecs
import io
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Union

from ...errors import InputError
from ..paths import closest_file, files_inside, url_hint
from ..piped import copy_of
from .magic import binary_kind

# UTF-32's marks first: UTF-32 LE's starts with UTF-16 LE's
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# A line end of its own: a CR not followed by LF (Excel for Mac ends every row so).
LONE_CR = re.compile(rb"(?<=\r)(?!\n)")


class RecodedLines:
    """A UTF-16 or UTF-32 file read as UTF-8 bytes, lines split on "\\n": what the binary file
    object of a UTF-8 file gives (iteration, readline, readlines, read)."""

    def __init__(self, path: str, raw: BinaryIO, encoding: str) -> None:
        self.path, self.encoding, self.number = path, encoding, 0
        # newline="\n": split on LF only and keep every CR, as a UTF-8 file is split. A lone
        # surrogate passes the decoder (which works a block at a time) and fails its own line's
        # encoding to UTF-8: the error names that line.
        self._text = io.TextIOWrapper(raw, encoding=encoding, errors="surrogatepass", newline="\n")

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def readline(self) -> bytes:
        line = self._decode(self._text.readline)
        self.number += 1
        return line

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines, size = [], 0
        for line in self:
            lines.append(line)
            size += len(line)
            if 0 < hint <= size:
                break
        return lines

    def read(self, size: int = -1) -> bytes:
        """Up to `size` characters, for format detection only: a character that is not text is
        replaced here, and named by the line reader."""
        try:
            return self._text.read(size).encode("utf-8", "replace")
        except UnicodeDecodeError:
            return b""

    def _decode(self, read: Callable[[], str]) -> bytes:
        try:
            return read().encode("utf-8")
        except (UnicodeDecodeError, UnicodeEncodeError) as exc:  # (a bare UnicodeError has no reason)
            name = self.encoding.upper()
            raise InputError(f"{self.path}:{self.number + 1}: not {name} text ({exc.reason}), though it "
                             f"starts with a {name} byte order mark; save the file as UTF-8") from None

    def __enter__(self) -> "RecodedLines":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._text.close()


def open_bytes(path: str) -> Union[BinaryIO, RecodedLines]:
    """The file for reading as UTF-8 bytes (a UTF-16 or UTF-32 file through RecodedLines); input
    piped in, from its copy (runner/files/piped.py)."""
    try:
        f = open(copy_of(path), "rb")
    except OSError as exc:
        raise cannot_read(path, exc) from None
    start = f.peek(4)[:4]
    for bom, encoding in BOMS:
        if start.startswith(bom):
            return RecodedLines(path, f, encoding)
    return f


def cannot_read(path: str, exc: OSError) -> InputError:
    """The error every reader gives for a file it cannot open or read."""
    if isinstance(exc, FileNotFoundError):
        return InputError(f"{path}: input file not found{url_hint(path, 'the questions') or closest_file(path)}")
    if isinstance(exc, IsADirectoryError):
        return InputError(f"{path}: input is a directory, not a file{_folder_hint(path)}")
    return InputError(f"{path}: cannot read input: {exc.strerror}")


def _folder_hint(path: str) -> str:
    """A Hugging Face dataset saved with save_to_disk (its state.json and Arrow files), or the
    question files a folder holds."""
    if Path(path, "state.json").is_file() and any(Path(path).glob("*.arrow")):
        return (" (a Hugging Face dataset saved with save_to_disk: write it as JSON Lines, "
                f"datasets.load_from_disk({str(path)!r}).to_json('questions.jsonl'))")
    return files_inside(path, (".jsonl", ".ndjson", ".json", ".csv", ".tsv"))


def split_lone_cr(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The lines again, a line that holds lone CRs cut after each: CSV rows end in CR, LF or
    CRLF. (A CR byte is never part of a multi-byte UTF-8 character.)"""
    for line in lines:
        if b"\r" in line:
            yield from filter(None, LONE_CR.split(line))
        else:
            yield line


def decoded(path: str, number: int, raw: bytes) -> str:
    """A line's text (a byte order mark at the start of the file dropped), or an InputError
    naming the line and column of a byte that is not UTF-8."""
    if number == 1:
        raw = raw[3:] if raw.startswith(codecs.BOM_UTF8) else raw
        no_binary(path, raw[:4096])
        no_utf16(path, raw[:4096])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                         f"{exc.start + 1}); save the file as UTF-8") from None


def read_text(path: str) -> str:
    """The whole file's text (UTF-8, or UTF-16 or UTF-32 with its byte order mark)."""
    try:
        with open(copy_of(path), "rb") as f:
            data = f.read()
    except OSError as exc:
        raise cannot_read(path, exc) from None
    if not any(data.startswith(bom) for bom, _ in BOMS):
        no_binary(path, data[:4096])
    return decoded_text(path, data)


def decoded_text(path: str, data: bytes) -> str:
    """A whole file's bytes as text: UTF-8, or UTF-16 or UTF-32 with its byte order mark; UTF-16
    without one, or a byte that is not UTF-8, is an InputError naming the file and line (a job
    file's reader says it as a ConfigError)."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return _recoded(path, data, encoding)
    no_utf16(path, data[:4096].split(b"\n", 1)[0])
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(not_utf8(path, data, exc.start)) from None


def not_utf8(path: str, data: bytes, start: int) -> str:
    """What to say of a file whose byte at `start` is not UTF-8: its line and column."""
    line = data.count(b"\n", 0, start) + 1
    column = start - (data.rfind(b"\n", 0, start) + 1) + 1
    return f"{path}:{line}: not UTF-8 text (byte 0x{data[start]:02x} at column {column}); save the file as UTF-8"


def _recoded(path: str, data: bytes, encoding: str) -> str:
    """A UTF-16 or UTF-32 file's text (its byte order mark dropped), or an InputError naming the
    line of the first thing that is not text."""
    text = ""
    try:
        text = data.decode(encoding, "surrogatepass")
        text.encode("utf-8")  # a lone surrogate, named by its line
        return text
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:  # (a bare UnicodeError has no start)
        before = text[:exc.start] if text else data[:exc.start].decode(encoding, "replace")
        line = before.count("\n") + 1
        name = encoding.upper()
        raise InputError(f"{path}:{line}: not {name} text ({exc.reason}), though it starts with a {name} "
                         "byte order mark; save the file as UTF-8") from None


def no_binary(path: str, start: bytes) -> None:
    """An InputError for bytes that are not text at all (magic.binary_kind), which would otherwise
    be read as CSV, or as UTF-16 without a byte order mark, and fail on some stray byte."""
    known = binary_kind(path, start)
    if known is not None:
        kind, instead = known
        raise InputError(f"{path}: {kind}, not text; {instead.replace('PATH', repr(str(path)))}")


def no_utf16(path: str, first_line: bytes) -> None:
    """An InputError for UTF-16 text without a byte order mark, which would decode as UTF-8 with
    a zero byte beside every Latin letter."""
    if first_line.count(0) * 3 > len(first_line):
        raise InputError(f"{path}:1: UTF-16 text without a byte order mark (every other byte is zero); "
                         "save the file as UTF-8, or as UTF-16 with its byte order mark")
