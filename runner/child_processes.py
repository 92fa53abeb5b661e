"""Child processes started from a thread that lives as long as this process.

Workers and the tokenizer ask Linux to kill them when their parent dies (PR_SET_PDEATHSIG:
workers/main.py die_with_parent), so a coordinator killed with -9 leaves nothing behind. Linux
sends that signal when the *thread* that started the child exits, not the process: a pool made in
a thread that then ends (a pipeline's set-up thread, Pool.starting's) would have its workers and
tokenizer killed under it. So a child is started from the main thread, or else from one daemon
thread kept for that (a daemon: never joined, it ends with the process and only then are the
children told).
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Optional

# What a child's process state (psutil's name for it) says of a child that holds work and makes
# no progress: said after the state by the stall messages (runner/watch/stalls.py, the tokenizer's)
STATE_HINTS = {"stopped": ": SIGSTOP or a debugger? SIGCONT resumes it",
               "disk-sleep": ": waiting on the disk, swapping?",
               "tracing-stop": ": stopped by a debugger"}

_requests: "queue.SimpleQueue[tuple[Callable[[], None], Future[None]]]" = queue.SimpleQueue()
_starter: Optional[threading.Thread] = None
_starter_lock = threading.Lock()


def _forget_starter() -> None:
    """In a forked child the starter thread is gone (and the lock may be held by a thread that
    is): the child makes its own when it needs one."""
    global _requests, _starter, _starter_lock
    _requests, _starter, _starter_lock = queue.SimpleQueue(), None, threading.Lock()


os.register_at_fork(after_in_child=_forget_starter)


def start_child(process: Any) -> None:
    """process.start() (a multiprocess Process) from a thread that outlives the child."""
    if threading.current_thread() is threading.main_thread():
        process.start()
        return
    done: Future[None] = Future()
    _requests.put((process.start, done))
    _ensure_starter()
    done.result()


def _ensure_starter() -> None:
    global _starter
    with _starter_lock:
        if _starter is None:
            _starter = threading.Thread(target=_serve, name="ggbatch-child-starter", daemon=True)
            _starter.start()


def _serve() -> None:
    while True:
        start, done = _requests.get()
        try:
            start()
        except BaseException as exc:  # the caller's to handle, as if it had started the child itself
            done.set_exception(exc)
        else:
            done.set_result(None)
