"""llama.cpp's log, taken in by ggbatch: workers never print (the coordinator owns the terminal).

llama.cpp says why a load failed, and how many layers it put on a GPU, only in its log. The
handler installed by `init_backend` keeps the last error lines (`errors`: read after a failed
call, cleared before it) and each load's offloaded layer count (`offloaded`). GGBATCH_LLAMA_LOG=1
also writes the whole log to stderr, for debugging.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import deque

import llama_cpp

# ggml.h's enum ggml_log_level (llama_cpp/_logger.py's comment has an older numbering).
_LOG_ERROR, _LOG_CONT = 4, 5
errors: deque[str] = deque(maxlen=16)  # the last error lines llama.cpp logged
# "load_tensors: offloaded 29/29 layers to GPU" (llama-model.cpp load_tensors, on builds that can
# offload): one entry a model load
offloaded: list[int] = []
_OFFLOADED = re.compile(r"offloaded (\d+)/\d+ layers to GPU")
_echo = bool(os.environ.get("GGBATCH_LLAMA_LOG"))
_last_level = 0
_backend_ready = False


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]  # a ctypes callback type, unannotated
def _keep(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _last_level
    line = text.decode("utf-8", "replace")
    if level == _LOG_CONT:
        if _last_level == _LOG_ERROR and errors:
            errors[-1] += line
    else:
        _last_level = level
        if level == _LOG_ERROR:
            errors.append(line)
        elif "layers to GPU" in line and (found := _OFFLOADED.search(line)):
            offloaded.append(int(found.group(1)))
    if _echo:
        sys.stderr.write(line)


def init_backend() -> None:
    """llama.cpp's backend initialised, its log going to the handler above; idempotent."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_keep, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True
