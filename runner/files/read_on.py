"""A line file read on as the run goes (runner/files/inputs.py): what it was when its first read
was made, and the check, once its records are all read (or one is refused), that the file read
is still that one, whole. A file cut short or rewritten in place meanwhile gave a mix of two
files' questions: its reader found a line broken where the cut fell and named it "malformed JSON"
on a line the file no longer has, or found the end early and left out the questions past it, or
answered the new file's questions from where the old one's had been read to. A file renamed over
the path (`mv`) is not this one: the file opened is read to its end. One that grew (questions
appended) is read on."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from stat import S_ISREG
from typing import Iterator, Optional, TypeVar

from ..errors import InputError
from .piped import copy_of

HEAD_CHECKED = 1 << 16  # the bytes that tell a file appended to from one rewritten in place

_R = TypeVar("_R")


@dataclass(frozen=True)
class FileAtStart:
    stat: os.stat_result
    head: bytes  # a digest of its first HEAD_CHECKED bytes


def at_start(path: str, head: int = HEAD_CHECKED) -> Optional[FileAtStart]:
    """The file as its first read finds it, with a digest of its first `head` bytes; None where it
    cannot be read (its reader says why) or is not a plain file (a FIFO's open waits for a writer)."""
    try:
        stat = os.stat(copy_of(path))
        if not S_ISREG(stat.st_mode):
            return None
        with open(copy_of(path), "rb") as f:
            return FileAtStart(os.fstat(f.fileno()), _digest(f.read(head)))
    except OSError:
        return None


def read_whole(path: str, was: Optional[FileAtStart], records: Iterator[_R]) -> Iterator[_R]:
    """The records of the file, then InputError (exit 2) if it was cut short or rewritten in
    place while they were read; a record refused on the way is said as the change when there was one."""
    try:
        yield from records
    except InputError:
        _unchanged(path, was)
        raise
    _unchanged(path, was)


def _unchanged(path: str, was: Optional[FileAtStart]) -> None:
    if was is None:
        return
    # as many first bytes as were digested then: a file shorter than HEAD_CHECKED then and appended
    # to since has the same first bytes
    now = at_start(path, min(HEAD_CHECKED, was.stat.st_size))
    if now is None or (now.stat.st_dev, now.stat.st_ino) != (was.stat.st_dev, was.stat.st_ino):
        return
    if now.stat.st_size < was.stat.st_size:
        raise InputError(f"{path}: the question file changed during the run (it is now {now.stat.st_size:,} bytes, "
                         f"was {was.stat.st_size:,}): run again once it is whole") from None
    if now.stat.st_mtime_ns != was.stat.st_mtime_ns and now.head != was.head:
        raise InputError(f"{path}: the question file was rewritten during the run (its first bytes are not those "
                         "read at its start): run again once it is whole") from None


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()
