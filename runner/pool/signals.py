"""SIGINT, SIGTERM and SIGHUP during a run, from its first moment: a stop at any moment ends the run the
same way (README, "Exit codes"). The first signal asks the run to stop; a second one stops it at
once (Interrupted raised where the main thread is).

    signal ─▶ STOP ─┬─ a pool attached ─▶ pool.request_stop marks the stop; the pool's loop
                    │                    tells the workers, questions decoding get a short
                    │                    grace, then the pool raises Interrupted
                    └─ none yet ────────▶ remembered, and handed to the pool as it is attached:
                                         the run makes its questions (the answers file lists
                                         them all, marked), starts no worker and ends at once

The handlers go in before anything starts a process or makes a temporary file (for
`ggbatch run`, before the command line is even read: runner/entry.py), so no signal finds the
run half-built, and every stop leaves no process and no temporary file behind. Only the main
thread can own signal handlers; elsewhere (a notebook's worker thread) signals keep their own.
A signal the process ignores as the run starts (SIG_IGN: a shell's background job, `cmd &`, starts
with SIGINT ignored; `nohup` ignores SIGHUP) stays ignored, as Python itself leaves it. SIGQUIT
keeps its default (a core dump, for a process that hangs): the journal has every answer, and the
rerun writes the answers file.
A handler runs between two lines of whatever the main thread was doing, a send to a worker
included: it sets flags or raises, and never sends, writes or logs itself.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Protocol

from ..errors import Interrupted

# SIGHUP: a closed terminal or ssh session, whose shell sends it to every job it started
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stoppable(Protocol):
    """What a signal goes to once a run has one (runner/pool/pool.py WorkerPool)."""

    def request_stop(self, signum: int) -> None:
        """Called inside the signal handler: mark the stop (a second call raises Interrupted)."""


class StopRequests:
    """The process's SIGINT, SIGTERM and SIGHUP while ggbatch holds them (one instance: STOP)."""

    def __init__(self) -> None:
        self.signum = 0  # the first signal not yet answered by an Interrupted
        self._pool: Optional[Stoppable] = None  # once the run has one
        self._previous: Optional[dict[int, Any]] = None
        self._at_once = False  # inside at_once(): the first signal raises Interrupted

    def install(self) -> bool:
        """Take the signals (idempotent); True when this call took them, and its caller gives
        them back with uninstall()."""
        if self._previous is not None or threading.current_thread() is not threading.main_thread():
            return False
        # an ignored signal is the caller's choice (nohup, a background job): it stays ignored
        self._previous = {s: signal.getsignal(s) for s in SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
        self.signum = 0
        for s in self._previous:
            signal.signal(s, self._on_signal)
        return True

    def uninstall(self) -> None:
        """Give the signals back; a signal that no run has answered yet goes on to the handler
        given back (Python's: KeyboardInterrupt for SIGINT, the end of the process for SIGTERM and
        SIGHUP)."""
        if self._previous is None:
            return
        previous, self._previous, self._pool = self._previous, None, None
        for s, handler in previous.items():
            signal.signal(s, handler)
        pending, self.signum = self.signum, 0
        if pending:
            signal.raise_signal(pending)

    def pass_on(self, signum: int) -> None:
        """A stop that ended a run started from Python (ggbatch.run, answer(resume_dir=)), its
        answers written, given to the caller's own handler as if the signal came now: Python's
        raises KeyboardInterrupt for SIGINT, and SIGTERM's default ends the process (exit 143), as
        the signal would without ggbatch. A handler that returns (or ggbatch still holding the
        signals) leaves the caller's Interrupted to be raised."""
        if self._previous is not None or threading.current_thread() is not threading.main_thread():
            return
        for stream in (sys.stdout, sys.stderr):  # what the script printed, before SIGTERM's end
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed, or None (pythonw)
                pass
        signal.raise_signal(signum)

    @contextmanager
    def run(self) -> Iterator["StopRequests"]:
        """A run's span: the signals held (unless held already), and answered by the Interrupted
        that ends it."""
        took = self.install()
        try:
            yield self
        except Interrupted:
            self.signum = 0  # the run has ended by it: nothing left to pass on
            raise
        finally:
            self._pool = None
            if took:
                self.uninstall()

    def attach(self, pool: Stoppable) -> None:
        """Signals go to this pool from now on; one already received stops it now."""
        self._pool = pool
        if self.signum:
            pool.request_stop(self.signum)

    def detach(self) -> None:
        """The pool is done; a signal from now on is remembered (a second one raises Interrupted)."""
        self._pool = None

    @contextmanager
    def at_once(self) -> Iterator[None]:
        """A span of work after the run that may stop anywhere (`run --score`'s scoring: every
        answer is written): the first signal raises Interrupted, as does one already received."""
        self._at_once = True
        try:
            if self.signum:
                raise Interrupted(self.signum)
            yield
        except Interrupted:
            self.signum = 0  # answered: nothing left to pass on
            raise
        finally:
            self._at_once = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        first = not self.signum
        self.signum = self.signum or signum
        if self._pool is not None:
            self._pool.request_stop(signum)  # a second request raises Interrupted
        elif not first or self._at_once:
            raise Interrupted(signum)
        # else: remembered for the pool, which says it is stopping (logging may not be set up yet)


STOP = StopRequests()
