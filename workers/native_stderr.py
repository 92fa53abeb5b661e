"""What native code (llama.cpp, Ray's C++ core) writes straight to file descriptor 2, past Python's
sys.stderr: taken aside for a call whose own errors say it better, so that the user reads one line."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Iterator


@contextlib.contextmanager
def stderr_captured() -> Iterator[list[str]]:
    """The lines native code writes to file descriptor 2 meanwhile (the list is filled on exit)."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", "replace").splitlines())
