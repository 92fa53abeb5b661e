"""Questions that can be read only once: `-` (standard input), a pipe or a process substitution
(`/dev/stdin`, `/dev/fd/63`: a FIFO or a character device). A question file is read several times
(its format detected from its start, its longest line measured, then its records read), and
`--score` reads it again for the gold answers, so such a file is first copied whole into a
temporary file, and every reader (runner/files/formats/textfile.py) reads the copy.

    cat q.jsonl | ggbatch run --input - ...   ─▶ copy ─▶ .ggbatch-input-XXXX beside the output
                                                         (read as "<stdin>", removed as the run ends)

The copy's bytes are hashed line by line as any file's are, so piping the same questions again
resumes from the journal. Messages name the file as the user gave it (`<stdin>` for `-`), never
the copy; the copy is removed however the run ends (an error, Ctrl-C), and one a run killed with
-9 left is removed by the next run that copies an input into the same folder.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import BinaryIO, Callable, Iterator

from ..closed_pipe import CLOSED_AT_START
from ..errors import InputError, Interrupted, OutputError
from .paths import OUTPUT, check_not_a_stream, check_writable

STDIN = "-"  # what --input names standard input by
STDIN_NAME = "<stdin>"  # standard input's name in messages
COPY_BYTES = 1 << 20
COPY_PREFIX = ".ggbatch-input-"  # of a copy's name, in the folder of the answers file or the temporary one
ABANDONED_AFTER_S = 10.0
_copies: dict[str, str] = {}  # the name a reader is given -> the copy it reads, while the copy lives


def reads_once(path: str) -> bool:
    """Whether the input is gone once read: `-`, or a FIFO, character device or socket."""
    if path == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False  # the reader says why it cannot be read
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def shown_name(path: str) -> str:
    """The input's name in messages."""
    return STDIN_NAME if path == STDIN else path


def copy_of(path: str) -> str:
    """The file a reader opens for `path`: its copy while one lives, else the path itself."""
    return _copies.get(path, path)


def is_copy(name: str) -> bool:
    return name in _copies


@contextmanager
def readable_input(path: str, output: str, stopped: Callable[[], int] = lambda: 0) -> Iterator[str]:
    """The question file's name for the run: `path` itself for a file that can be read again;
    for one read only once, the name messages give it (`<stdin>` for `-`), whose readers read a
    copy in the folder of `output` (the answers file) until the block ends. A name already
    copied (a run inside a command that copied it) is used as it is. `stopped`: the signal that
    asked the run to stop, if one did (runner/pool/signals.py): one that came while the input was
    copied raises Interrupted, as the copy may be cut short (its writer stopped by the same Ctrl-C)."""
    if not reads_once(path) or is_copy(path):
        yield path
        return
    check_not_a_stream(output)  # the output's own refusals first: nothing is read for a run that cannot write
    check_writable(output, OUTPUT)
    with _copied(path, os.path.dirname(os.path.realpath(output)), stopped) as name:
        yield name


@contextmanager
def readable_file(path: str) -> Iterator[str]:
    """readable_input for a command that writes no file beside its input (`score`'s answers and
    gold, `merge`'s question file, `tune`'s questions): a file read only once is copied into the
    system's temporary folder."""
    if not reads_once(path) or is_copy(path):
        yield path
        return
    with _copied(path, tempfile.gettempdir()) as name:
        yield name


@contextmanager
def _copied(path: str, folder: str, stopped: Callable[[], int] = lambda: 0) -> Iterator[str]:
    name = shown_name(path)
    remove_abandoned_copies(folder)
    try:
        fd, copy = tempfile.mkstemp(prefix=COPY_PREFIX, dir=folder)
        # held while the copy lives (the kernel lets go of it when its process is killed): a
        # copy no process holds was left by a run killed with -9, which no finally removes
        held = os.open(copy, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)
    except OSError as exc:
        raise OutputError(f"{folder}: cannot hold a copy of the questions read from {name}: "
                          f"{exc.strerror or exc}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                _copy(path, name, out)
        except OSError as exc:  # writing the copy: reading says InputError
            raise OutputError(f"{folder}: cannot hold a copy of the questions read from {name}: "
                              f"{exc.strerror or exc}") from None
        if stopped():
            raise Interrupted(stopped())
        _copies[name] = copy
        yield name
    finally:
        _copies.pop(name, None)
        os.unlink(copy)
        os.close(held)


def remove_abandoned_copies(folder: str) -> None:
    """Remove the copies in `folder` that no living run holds (each run holds its own copy's
    lock), older than ABANDONED_AFTER_S: one just made is not locked yet."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(COPY_PREFIX)]
    except OSError:
        return
    for candidate in (os.path.join(folder, n) for n in names):
        try:
            if time.time() - os.stat(candidate).st_mtime < ABANDONED_AFTER_S:
                continue
            fd = os.open(candidate, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(candidate)
        except OSError:  # held: its run is alive (or the copy went meanwhile)
            pass
        finally:
            os.close(fd)


def _copy(path: str, name: str, out: BinaryIO) -> None:
    """Everything the input holds, until its end, into `out`."""
    if path == STDIN and 0 in CLOSED_AT_START:  # `<&-`: it read as an empty file, 0 answers and exit 0
        raise InputError(f"{name}: standard input is closed; pipe the questions in "
                         "(cat questions.jsonl | ggbatch run --input - ...) or give --input a file")
    try:
        # O_NOCTTY: a run that leads its own session (setsid, a daemon's child) given a terminal's
        # path would make it its controlling terminal, and die of its hangup (SIGHUP) once closed
        source: BinaryIO = (sys.stdin.buffer if path == STDIN else
                            os.fdopen(os.open(path, os.O_RDONLY | os.O_NOCTTY), "rb"))
    except (OSError, AttributeError) as exc:  # (sys.stdin may be None, or a stream without a buffer)
        raise InputError(f"{name}: cannot read input: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        if source.isatty():
            raise InputError(f"{name}: the input is a terminal; pipe the questions in "
                             "(cat questions.jsonl | ggbatch run --input - ...)")
        while chunk := _read(source, name):
            out.write(chunk)  # an OSError here is the copy's (a full disk): readable_input names its folder
    finally:
        if source is not sys.stdin.buffer:
            source.close()


def _read(source: BinaryIO, name: str) -> bytes:
    try:
        return source.read(COPY_BYTES)
    except OSError as exc:
        raise InputError(f"{name}: cannot read input: {exc.strerror or exc}") from None
