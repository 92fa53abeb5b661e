"""The calls' questions as the feed of the pool's one long run (runner/pool/intake.py Feed):
callers put questions from their threads, the pool's loop thread polls them. Questions that
need a larger context than the workers have make them start again with one first
(runner/plan/growth.py), as a streamed file's later window does; so do calls that generate, the
first time their open questions outnumber a warm pool's slots."""

from __future__ import annotations

import threading
from typing import Callable, Mapping, Optional, Sequence

from ...workers.protocol import EngineConfig, Question
from ..plan.growth import ContextGrowth
from ..pool.wake import WakePipe


class Submissions:
    def __init__(self, growth: ContextGrowth, reconfigure: Callable[[Mapping[int, EngineConfig]], None],
                 open_questions: Callable[[], int]) -> None:
        self._growth, self._reconfigure = growth, reconfigure
        self._open_questions = open_questions  # those the calls wait for: the pool's load
        self._lock = threading.Lock()
        self._waiting: list[Question] = []
        self._withdrawn: set[str] = set()  # cancelled after their poll: the pool's run drops them if pending
        self._finishing = False
        self._cancelled: Optional[BaseException] = None
        self._wake = WakePipe()  # the loop waits for a call, a finish or a cancel, not polls

    @property
    def wake_fd(self) -> int:
        return self._wake.fd

    @property
    def done(self) -> bool:
        """Closing, with nothing left to hand out: the run ends once the workers have answered."""
        with self._lock:
            return self._finishing and not self._waiting and self._cancelled is None

    def put(self, questions: Sequence[Question]) -> None:
        with self._lock:
            self._waiting.extend(questions)
        self._wake.wake()

    def poll(self) -> Optional[Sequence[Question]]:
        """(The loop thread) what was put since the last poll; raises what cancelled the pool."""
        with self._lock:
            if self._cancelled is not None:
                raise self._cancelled
            taken, self._waiting = self._waiting, []
        if not taken:
            return None
        for_context = self._growth.engines_for(taken)
        engines = for_context
        # Questions that only score continuations generate nothing, and a step's width gains them
        # little (lm-eval's MMLU took about as long in the backend at 16 slots as at 64:
        # docs/performance/pools-and-weighing.md): they grow nothing.
        generating = [q for q in taken if not q.continuations]
        if generating:
            # the questions open before this poll as a sequence each, this poll's with their samples
            n = [q.generation.sampling.n if q.generation else self._growth.generation.sampling.n for q in generating]
            sequences = self._open_questions() - len(generating) + sum(n)
            engines = self._growth.engines_for_load(sequences, max(n)) or for_context
        if engines is not None:
            self._reconfigure(engines)
        return taken

    def withdraw(self, qids: Sequence[str]) -> None:
        """(A caller's thread) questions whose call was cancelled: dropped here if not polled yet,
        else by the pool's run, if no worker has them (withdrawn)."""
        if not qids:
            return
        with self._lock:
            gone = set(qids)
            self._withdrawn |= gone - {q.qid for q in self._waiting}
            self._waiting = [q for q in self._waiting if q.qid not in gone]
        self._wake.wake()

    def withdrawn(self) -> set[str]:
        """(The loop thread) the questions withdrawn since the last time, once polled."""
        with self._lock:
            taken, self._withdrawn = self._withdrawn, set()
        return taken

    def finish(self) -> None:
        """No more calls: what was put is answered, then the run ends."""
        with self._lock:
            self._finishing = True
        self._wake.wake()

    def cancel(self, why: BaseException) -> None:
        """End the run at the next poll: the workers are killed, the open calls fail with `why`."""
        with self._lock:
            self._cancelled = why
        self._wake.wake()

    def close(self) -> None:
        """The wake pipe's descriptors go back (once the loop has ended)."""
        self._wake.close()
