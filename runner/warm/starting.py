"""Pool.starting's background start: the pool made in a thread and handed over in a Future, and
closed at the interpreter's exit if the caller never took it (runner/warm/pool.py)."""

from __future__ import annotations

import atexit
import logging
import threading
from concurrent.futures import Future
from contextlib import ExitStack
from functools import partial
from typing import Callable, TypeVar

log = logging.getLogger("ggbatch")

_P = TypeVar("_P")


def _close_at_exit(starting: "Future[_P]", close: Callable[[_P], None]) -> None:
    """A pool still starting at exit (ggbatch eval stopped by a task's error) is waited for, then
    closed as one left open is: else children still starting print multiprocess's SemLock
    traceback, or its exit handler (run after this one) waits for good on workers no one stops."""
    if not starting.done():  # the caller has had its last word (often an error): the start is no news
        log.setLevel(logging.ERROR)
    try:
        pool = starting.result()
    except BaseException:  # it never started: nothing of it is left running
        return
    close(pool)


def start_in_thread(make: Callable[[], _P], close_at_exit: Callable[[_P], None],
                    resources_of: Callable[[_P], ExitStack]) -> "Future[_P]":
    """make() in a thread; the Future holds the pool, or why it could not start. It is running
    from the start, so it cannot be cancelled: a pool half started has no one else to close it.
    close_at_exit closes a pool the caller never took; resources_of gives the stack of what a pool
    closes with it."""
    future: Future[_P] = Future()
    future.set_running_or_notify_cancel()
    # This start's own exit handler, taken back once the pool is closed (or failed to start):
    # kept, it held the closed pool, its pipes and semaphores, until the process exited.
    closer = partial(_close_at_exit, future, close_at_exit)

    def start() -> None:
        try:
            pool = make()
        except BaseException as exc:  # the caller hears it from the Future
            atexit.unregister(closer)
            future.set_exception(exc)
        else:
            resources_of(pool).callback(atexit.unregister, closer)
            future.set_result(pool)

    atexit.register(closer)
    threading.Thread(target=start, name="ggbatch-pool-start", daemon=True).start()
    return future
