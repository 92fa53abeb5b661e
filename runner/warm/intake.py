"""The calls' questions as the feed of the pool's one long run (runner/pool/intake.py Feed):
callers put questions from their threads, the pool's loop thread polls them. Questions that
need a larger context than the workers have make them build one first
(runner/plan/growth.py), as a streamed file's later window does; so do calls that generate, the
first time their open questions' sequences outnumber a warm pool's slots."""

from __future__ import annotations

import threading
from typing import Callable, Mapping, Optional, Sequence

from ...workers.protocol import Answer, EngineConfig, FinishReason, GenerationParams, Question
from ..plan.growth import ContextGrowth
from ..pool.wake import WakePipe
from ..questions.prepare import question_samples


def load_of(generation: GenerationParams) -> Callable[[Question], int]:
    """The sequences a question holds in a worker's slots while it decodes, as a warm pool's load
    counts them: its samples, each a sequence of its own once the prompt is in. 0 for a
    question that only scores continuations: a step's width gains it little (lm-eval's MMLU took
    about as long in the backend at 16 slots as at 64: docs/performance/pools-and-weighing.md), so
    it grows nothing. A question of more samples than a worker can come to hold never comes
    here: too_wide answers it first."""

    def load(question: Question) -> int:
        return 0 if question.continuations else question_samples(question, generation)

    return load


def too_wide(questions: Sequence[Question], generation: GenerationParams,
             most_per_worker: int) -> tuple[list[Question], dict[str, Answer]]:
    """The questions a worker of the pool can hold, and an error answer for each of more samples
    than any worker can come to hold: said here, where the cap is known, rather than by a worker
    that has not grown yet and knows only its own slots."""
    kept, refused = [], {}
    for q in questions:
        n = question_samples(q, generation)
        if n <= most_per_worker:
            kept.append(q)
            continue
        refused[q.qid] = Answer(qid=q.qid, text="", finish_reason=FinishReason.ERROR, error=(
            f"n: {n} samples decode together, a slot each, and a worker of this pool holds {most_per_worker} at most "
            "(the auto cap, or slots=): ask for fewer, or give the pool its sampling.n, planned for from the start"))
    return kept, refused


class Submissions:
    """A warm pool's feed (runner/pool/intake.py Feed): what the calls put, polled by the pool's run."""

    def __init__(self, growth: ContextGrowth, reconfigure: Callable[[Mapping[int, EngineConfig]], None],
                 open_sequences: Callable[[], int], load: Callable[[Question], int]) -> None:
        """open_sequences: those of the questions the calls wait for, the pool's load; load: a
        question's share of it (load_of)."""
        self._growth, self._reconfigure = growth, reconfigure
        self._open_sequences, self._load = open_sequences, load
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
        engines = self._growth.engines_for(taken)
        widest = max(map(self._load, taken))  # a question's samples decode together, in one worker
        if widest:
            engines = self._growth.engines_for_load(self._open_sequences(), widest) or engines
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
