"""Standard output and error whose reader may leave early (`ggbatch run ... | true`, `ggbatch score
... |& head -1`), or that were never open (`2>&-`).

Python ignores SIGPIPE, so the first write to a closed pipe raises BrokenPipeError, often only at
the interpreter's last flush, after the command has done its work. A hung-up terminal (a closed
ssh session, whose SIGHUP stops the run) fails every write with EIO in the same way: a run stopped
by that SIGHUP failed on its next line of output, and left no answers file. What was printed was
for a reader that is gone; the command's exit code is still its own. So the stream points its
file descriptor at /dev/null on the first such error (the recipe of Python's signal docs) and the
command carries on: the rest of what it prints, and the flush at exit, go nowhere quietly.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any, TextIO

CLOSED_AT_START: set[int] = set()  # the standard descriptors found closed, now over /dev/null


def standard_streams_open() -> None:
    """Point a closed standard descriptor (0, 1 or 2: `ggbatch run ... 2>&-`) at /dev/null. Else
    the first file opened takes its number: the worker and tokenizer processes inherit them, and
    what they write to "stderr" would land in that file, or fail."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            CLOSED_AT_START.add(fd)  # `--input -` then refuses it: /dev/null would read as no questions
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:  # Python found it closed at start: a stream over /dev/null now
            setattr(sys, name, os.fdopen(fd, "r" if fd == 0 else "w", encoding="utf-8", errors="replace"))


def standard_streams_write_anything() -> None:
    """Standard output and error write what their encoding lacks as a replacement character: under
    LC_ALL=C (ASCII) or an ISO-8859 locale the summary's "×" and "→" failed the command after every
    answer was written (stderr already replaced; stdout's strict or surrogateescape raised)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors not in ("replace", "backslashreplace"):
            stream.reconfigure(errors="replace")


class ClosedPipeSafe:
    """A text stream (sys.stdout) that a closed pipe never fails; everything else is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            if not reader_gone(exc):
                raise
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if not reader_gone(exc):
                raise
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:
            self._stream.flush()  # what is still buffered goes to /dev/null now
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


def reader_gone(exc: OSError) -> bool:
    """A write that failed because nobody reads any more: a closed pipe, or a hung-up terminal."""
    return isinstance(exc, BrokenPipeError) or exc.errno == errno.EIO
