"""What the pool knows of each worker's llama.cpp thread count, for the thread controller
(runner/watch/thread_controller.py decides, runner/watch/watch.py asks through the pool):

    Ready(n_threads) ─▶ started(n)        the layout's count: the ceiling of this life
    pool.set_threads ─▶ ask(n) ─▶ SetThreads(n) ─▶ worker ─▶ ThreadsSet ─▶ answered(msg)
    pool.llama_threads ─▶ view(configured) ─▶ WorkerThreads

One change at a time: a worker asked and not answered yet is not settable, so the controller
never sends a second count that would cross the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...workers.protocol import SetThreads, ThreadsSet


@dataclass(frozen=True)
class WorkerThreads:
    """A live worker's llama.cpp threads, for runner/watch/thread_controller.py."""

    current: int
    ceiling: int  # what it started with: the layout's
    settable: bool  # no change asked and not answered yet, and its engine can change it


@dataclass
class ThreadCount:
    """One life of a worker's thread count (a restarted worker starts a new one)."""

    ceiling: Optional[int] = None  # llama.cpp's count when the worker said Ready
    n_threads: Optional[int] = None  # llama.cpp's, as the worker last said (Ready, then ThreadsSet)
    asked: Optional[int] = None  # a SetThreads not answered yet
    fixed: bool = False  # its engine cannot change its thread count (this life)

    def started(self, n_threads: int) -> None:
        """The worker said Ready with llama.cpp running n_threads."""
        self.ceiling = self.n_threads = n_threads

    def ask(self, n: int) -> SetThreads:
        """The message asking the worker for n threads from its next step; answered by ThreadsSet."""
        self.asked = n
        return SetThreads(n)

    def answered(self, msg: ThreadsSet) -> None:
        # Asked for another count and got the same: an engine without llama.cpp (tests' fake).
        self.fixed = msg.n_threads == msg.before and msg.before != self.asked
        self.asked = None
        self.n_threads = msg.n_threads or self.n_threads

    def view(self, configured: int) -> WorkerThreads:
        """Its threads as the controller sees them. One still building its engine runs the
        configuration's count: a SetThreads sent now reaches it before its first step, which under
        contention is the slowest (the prompts)."""
        ceiling = self.ceiling if self.ceiling is not None else configured
        return WorkerThreads(self.n_threads or ceiling, ceiling, self.asked is None and not self.fixed)
