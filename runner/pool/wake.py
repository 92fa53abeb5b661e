"""A pipe that ends the pool loop's wait for its workers: a producer writes a byte when it has
something new (a warm pool's call: runner/warm/intake.py), the loop's wait sees the read end
readable and drains it (runner/pool/local.py). Without it the loop would look for news every few
milliseconds, waking an idle pool's process dozens of times a second."""

from __future__ import annotations

import os


class WakePipe:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    @property
    def fd(self) -> int:
        """The end to wait on."""
        return self._read

    def wake(self) -> None:
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:  # full: readable already, the loop wakes all the same
            pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass


def drain(fd: int) -> None:
    """Read what the pipe holds, without blocking."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
