"""The pool's side of a streamed file's windows (runner/questions/feed.py makes them in a thread while the
workers answer): when the pool takes the next one, and how long it waits for its workers
meanwhile.

The pool takes the next window when fewer than `below` questions are pending, so the workers
never run dry while the file is far from read, and the run ends only when the feed has given its
last window and every question has its answer. A feed with a wake file descriptor (a warm pool's
calls: runner/warm/intake.py) ends the pool's wait for its workers when it has something new; one
without (a streamed file's windows) is polled: while the pool has nothing to hand out but a window
to come, it looks again every FEED_WAIT_S rather than waiting a whole monitor tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Optional, Protocol, Sequence

from ...workers.protocol import Question

FEED_WAIT_S = 0.02  # how often an idle pool looks for the next window of a streamed file


class Feed(Protocol):
    """Questions that come while the pool runs: the windows of a streamed file after the first
    (runner/questions/feed.py QuestionFeed), or a warm pool's calls (runner/warm/intake.py
    Submissions)."""

    @property
    def done(self) -> bool:
        """The last window has been taken."""

    def poll(self) -> Optional[Sequence[Question]]:
        """The next window if it is made (or what stopped its making, raised), else None at once."""

    @property
    def wake_fd(self) -> Optional[int]:
        """A file descriptor made readable when poll() has something new or done changes (the
        pool's wait drains it); None: the feed is polled every FEED_WAIT_S."""

    def withdrawn(self) -> Collection[str]:
        """Questions it gave that are no longer asked (a warm pool's cancelled calls): the pool
        hands out none of them not handed out yet."""


@dataclass
class WindowIntake:
    """A pool run's feed (None: every question was given at the start) and when to take from it."""

    feed: Optional[Feed] = None
    below: int = 0  # take the next window when fewer questions than this are pending

    @property
    def to_come(self) -> bool:
        """A window is still to be taken: the run goes on even with every question answered."""
        return self.feed is not None and not self.feed.done

    def take(self, n_pending: int) -> Sequence[Question]:
        """The next window's questions if the pending ones run low and it is made; () otherwise,
        at once."""
        if self.feed is not None and not self.feed.done and n_pending < self.below:
            return self.feed.poll() or ()
        return ()

    @property
    def wake_fd(self) -> Optional[int]:
        return self.feed.wake_fd if self.feed is not None else None

    def withdrawn(self) -> Collection[str]:
        return self.feed.withdrawn() if self.feed is not None else ()

    def wait_s(self, timeout: float, feeding: bool, n_pending: int) -> float:
        """How long the pool may wait for its workers: FEED_WAIT_S at most while it has nothing to
        hand out but is feeding (a window to come, not stopping) from a feed that cannot wake it."""
        polled = feeding and not n_pending and self.wake_fd is None
        return min(timeout, FEED_WAIT_S) if polled else timeout
