"""A pipe that ends the pool loop's wait for its workers: a producer writes a byte when it has
something new (a warm pool's call: runner/warm/intake.py), the loop's wait sees the read end
readable and drains it (runner/pool/local.py). Without it the loop would look for news every few
milliseconds, waking an idle pool's process dozens of times a second."""

from __future__ import annotations

import os
import threading


class WakePipe:
    """wake() from any thread, also after close() (a caller's late call as the pool closes): then
    it does nothing, rather than write to a descriptor number the process may have reused."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def fd(self) -> int:
        """The end to wait on."""
        return self._read

    def wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._write, b"\0")
            except BlockingIOError:  # full: readable already, the loop wakes all the same
                pass

    def close(self) -> None:
        """Idempotent; the loop that waits on fd must have ended."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)


def drain(fd: int) -> None:
    """Read what the pipe holds, without blocking."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
