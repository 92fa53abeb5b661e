"""Where a warm pool's Futures are resolved: threads of their own, never the pool's loop thread.

A Future runs its done-callbacks on the thread that resolves it. Resolved on the loop thread, a
callback that called the pool (asyncio's and other callback code's way) waited there for an
answer that only the loop could give: the pool hung for good, and close() in a callback could not
join its own thread. Here the loop hands each resolution over and goes on; a thread waiting for a
job takes it, and a job that finds none waiting (one is in a callback still, a nested call's
perhaps) starts another, so a callback that waits on the pool never waits on itself.

    loop thread: Calls.append ─▶ Resolver.hand(job) ─▶ a resolver thread: Future.set_result ─▶ callbacks
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable, Optional

IDLE_S = 5.0  # a resolver thread with no job this long ends: an idle pool holds no thread


def settle(future: "Future[Any]", result: Any = None, error: Optional[BaseException] = None) -> None:
    """The Future's result (or error), unless its caller cancelled it meanwhile."""
    try:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:  # cancelled between the check and the setting: the caller gave up
        pass


class Resolver:
    """Runs the jobs handed to it in order on threads of its own, one more whenever none is free."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._jobs: deque[Callable[[], None]] = deque()
        self._free = 0  # threads waiting for a job
        self._threads: set[threading.Thread] = set()

    def hand(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            if self._free >= len(self._jobs):  # a waiting thread for each job not yet taken
                self._cond.notify()
                return
            thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._threads.add(thread)
        thread.start()

    def _serve(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    self._free += 1
                    self._cond.wait(IDLE_S)
                    self._free -= 1
                if not self._jobs:  # idle, or drained by close(): this thread ends
                    self._threads.discard(threading.current_thread())
                    self._cond.notify_all()
                    return
                job = self._jobs.popleft()
            job()

    def close(self) -> None:
        """Returns once every job handed so far has run (its Future resolved, its callbacks
        called) and the threads have ended; a close from a callback waits for the others only."""
        me = threading.current_thread()
        with self._cond:
            while self._jobs or self._threads - {me}:
                # a thread that finished its job after the last notify waits IDLE_S: wake it again
                self._cond.notify_all()
                self._cond.wait(0.1)
