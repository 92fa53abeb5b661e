"""Whole messages from a child's results pipe (a worker's, the tokenizer's), read without ever
blocking the coordinator.

A child writes each message with multiprocessing's Connection.send_bytes: a 4-byte big-endian
length, then the bytes (a length of -1 is followed by an 8-byte one, for messages over 2 GiB).
Connection.recv_bytes, once the first byte shows, blocks until the last has come. A worker
stopped (SIGSTOP, swapped out, a debugger) in the middle of a message longer than the pipe's
buffer would then freeze the coordinator: no ticks, no stall warning, no dispatch to the other
workers, Ctrl-C only marked. So the coordinator reads what the pipe holds, without blocking,
and takes the messages that are whole; the rest waits in a buffer for the next read.
"""

from __future__ import annotations

import os
import struct
from typing import Any

LENGTH = struct.Struct("!i")
LONG_LENGTH = struct.Struct("!Q")  # after a LENGTH of -1
READ_SIZE = 1 << 20


def whole_frames(buffer: bytearray) -> list[bytes]:
    """The whole messages at the front of `buffer`, taken out of it (at once: a read holding
    many small messages is not shifted once per message); a partial one stays."""
    frames = []
    at = 0
    while len(buffer) - at >= LENGTH.size:
        (n,) = LENGTH.unpack_from(buffer, at)
        start = at + LENGTH.size
        if n == -1:
            if len(buffer) < start + LONG_LENGTH.size:
                break
            (n,) = LONG_LENGTH.unpack_from(buffer, start)
            start += LONG_LENGTH.size
        if len(buffer) < start + n:
            break
        frames.append(bytes(buffer[start:start + n]))
        at = start + n
    del buffer[:at]
    return frames


class FrameReader:
    """The reading end of a results pipe (a multiprocessing Connection, whose descriptor it
    makes non-blocking and reads itself). Waitable: it has fileno()."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._fd: int = connection.fileno()
        os.set_blocking(self._fd, False)
        self._buffer = bytearray()
        self.ended = False  # the writing end is closed: the worker is gone

    def fileno(self) -> int:
        return self._fd

    def read(self) -> list[bytes]:
        """The messages that are whole now, in order. At the end of the pipe a partial message
        left (the worker died writing it) is dropped, and `ended` is set."""
        while not self.ended:
            try:
                chunk = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.ended = True
            self._buffer += chunk
        frames = whole_frames(self._buffer)
        if self.ended:
            self._buffer.clear()
        return frames

    def close(self) -> None:
        self._connection.close()
