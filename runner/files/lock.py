"""One run per output file: an exclusive lock beside it, so two cron firings never interleave.
flock is released by the kernel when the holder dies, so a killed run never leaves a stale lock."""

from __future__ import annotations

import fcntl
import os
from typing import Optional

from ..errors import OutputError
from .paths import lock_path


def lock_holder(output: str) -> Optional[str]:
    """The pid (as its lock file says it, "unknown" if it does not) of the run writing `output`
    now, as OutputLock finds it; None when no run holds its lock. Tested with a shared lock held
    for an instant (a run starting in that instant is refused, as by any other holder), on a
    file opened read-only: nothing is created or written beside a part that may not be ours."""
    try:
        fd = os.open(lock_path(output), os.O_RDONLY)
    except OSError:
        return None  # no lock file (no run made one), or none this user may read
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # releases the shared lock, if it was taken
    return None


def _holder(fd: int) -> str:
    return os.read(fd, 32).decode(errors="replace").strip() or "unknown"


class OutputLock:
    def __init__(self, output: str) -> None:
        self.output = output
        self.path = lock_path(output)
        self._fd: int | None = None

    def __enter__(self) -> "OutputLock":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise OutputError(f"{self.output}: another ggbatch run (pid {holder}) is writing this "
                                  f"output (lock file {self.path})") from None
            # The previous holder may have removed the file between our open and our lock: then
            # we hold a lock on a file nobody else will see, so start over on the new one.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            try:
                os.unlink(self.path)  # while still holding the lock (see __enter__)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None
