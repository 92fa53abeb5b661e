"""The worker pool: start pinned workers, hand out questions as they ask, collect the answers,
notice deaths and give a dead worker's questions to the others.

    [feed: the next window of a streamed file] ─▶ pending (longest prompts first)
    pending ──Chunk──▶ link.send ──▶ worker i
    backend.wait(links, timeout = next monitor tick) ◀── Ready | WantWork | AnswerBatch |
                                                         EngineStats | WorkerError, or its death
    set_threads(i, n) ──SetThreads──▶ link.send;  ThreadsSet ──▶ on_threads  (runner/pool/worker_threads.py)
    Ready ──▶ on_ready, before the worker's WantWork is answered: a SetThreads sent then comes
              before its first Chunk, so its first step already runs the count asked
    reconfigure(engines) ──▶ each worker gets no new Chunk, finishes what it holds, then starts
              again with its new engine (a streamed file's later window needs a larger context)

Where workers live is the backend's business, behind three calls (start, wait, close): local
processes (runner/pool/local.py: a task queue and a results pipe each, deaths seen on the
process sentinels) or Ray actors on a cluster's nodes (runner/pool/ray.py). Dispatch, deaths,
restarts and the crash budget are the same for both.

A streamed file's questions come in windows (runner/questions/prepare.py): the pool takes the next one
from its feed when fewer than `feed_below` questions are pending, and the run ends when the
feed has given its last and every question has its answer (runner/pool/intake.py).

Dispatch is pull-based: a worker says how many questions it wants when its engine runs low, and
runner/pool/dispatch.py says what it gets.

Stopping (SIGINT/SIGTERM through `request_stop`, inside the signal handler: it only marks the
stop): no new questions go out, and at the loop's next turn (at most TICK_S later) every worker is
told to Stop (finish what is decoding, drop what has not started); after GRACE_S or when all
have exited, Interrupted is raised. A second request raises Interrupted at once.

The workers' lives (starting, restarting after a death or a reconfigure, letting go, what a death
costs) are runner/pool/lives.py's: the pool tells it of each death and requeues the dead worker's
questions as it says.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Collection, Mapping, Optional, Protocol, Sequence, Union

from ...workers.protocol import (
    Answer,
    AnswerBatch,
    Chunk,
    Configure,
    EngineConfig,
    EngineStats,
    Question,
    Ready,
    Stop,
    ThreadsSet,
    WantWork,
    WorkerError,
)
from ...workers.spec import WorkerSpec
from ..errors import Interrupted, ModelError
from ..model.identity import ModelIdentity
from .backend import Backend
from .dispatch import next_chunk, withdraw
from .intake import Feed, WindowIntake
from .lives import WorkerLives
from .local import LocalBackend
from .start_notes import StartNotes
from .worker_run import WorkerRun
from .worker_state import WorkerState, added, worker_run
from .worker_threads import WorkerThreads

log = logging.getLogger("ggbatch")

TICK_S = 1.0
GRACE_S = 2.0  # in-flight questions may finish this long after a stop request


class RunEvents(Protocol):
    """Who hears of a run (runner/watch/watch.py RunWatch): its answers, a tick about once a
    second, the workers' thread changes and their Ready."""

    def on_answers(self, answers: list[Answer]) -> None: ...

    def tick(self, pool: "WorkerPool") -> None: ...

    def on_threads(self, msg: ThreadsSet) -> None: ...

    def on_ready(self, pool: "WorkerPool", msg: Ready) -> None: ...


class WorkerPool:
    def __init__(self, specs: Sequence[WorkerSpec], *, on_answers: Callable[[list[Answer]], None] = lambda a: None,
                 on_tick: Optional[Callable[["WorkerPool"], None]] = None,
                 backend: Optional[Backend[Any]] = None,
                 on_threads: Optional[Callable[[ThreadsSet], None]] = None, keep_answers: bool = True,
                 on_ready: Optional[Callable[["WorkerPool", Ready], None]] = None,
                 model: Optional[ModelIdentity] = None) -> None:
        """backend: where workers live (default: local processes, runner/pool/local.py).
        on_threads: called with a worker's answer to set_threads; on_ready: with each Ready (a
        worker has loaded and built its engine). keep_answers: keep every answer in `answers`
        (the job keeps them in its journal instead, through on_answers). The callbacks may
        instead come with run()'s `events`, when who hears of the run is made after the workers
        start. model: the file the run answers with, checked at each worker's start
        (runner/pool/lives.py). How many deaths a question and the pool may take:
        runner/pool/crashes.py."""
        self._backend: Backend[Any] = backend or LocalBackend()
        self._on_threads = on_threads
        self._on_ready = on_ready
        self._lives = WorkerLives(self._backend, len(specs), model)
        self.workers = [WorkerState(replace(spec, log_path=self._lives.log_path(spec))) for spec in specs]
        self._on_answers = on_answers  # called with each batch of new answers
        self._on_tick = on_tick
        self._pending: deque[Question] = deque()
        self._suspects: deque[tuple[Question, ...]] = deque()  # groups, from workers that died
        self.answers: dict[str, Answer] = {}  # when keep_answers
        self._keep_answers = keep_answers
        self.n_answered = 0
        self._open: set[str] = set()  # qids pending or in flight: an answer to anything else is a repeat
        self.paused = False  # admit no new questions (memory is low, or stopping)
        self.finished = False  # every question answered; the workers are still alive
        self._stop_signal = 0
        self._stop_deadline = 0.0
        self.first_ready_at: Optional[float] = None
        self._notes = StartNotes()  # what workers' starts show, each said once a run
        self._dead_links: set[int] = set()  # links seen dead in this wait, their deaths not handled yet

    # -- public ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the workers: they pin themselves and load the model, then wait for run()."""
        for w in self.workers:
            if w.link is None:
                self._lives.start(w)

    def keep(self, worker_ids: Collection[int]) -> None:
        """Let go of the workers not named (the memory plan wants fewer)."""
        self.workers = self._lives.keep(self.workers, worker_ids)

    def close(self) -> None:
        """Kill every worker (an error before run(), or nothing left to answer); idempotent."""
        self._lives.shutdown(self.workers, graceful=False)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def worker_runs(self) -> list[WorkerRun]:
        """What each worker did, for the report."""
        return [worker_run(w) for w in self.workers]

    def engine_counters(self) -> dict[int, EngineStats]:
        """worker id -> its engine's counters over all its lives, as last sent (at most
        STATS_EVERY_S old while it works; whole once it has answered everything it held)."""
        out = {}
        for w in self.workers:
            total = added(w.earlier, w.live)
            if total is not None:
                out[w.spec.worker_id] = total
        return out

    def run(self, questions: Sequence[Question], engine: Union[EngineConfig, Mapping[int, EngineConfig]],
            feed: Optional[Feed] = None, feed_below: int = 0, events: Optional[RunEvents] = None) -> dict[str, Answer]:
        """Answer every question (or record why not), and those of every window `feed` gives
        (taken when fewer than feed_below questions are pending). Questions should come longest
        first. engine: every worker's, or each worker's by id (nodes of different sizes).
        events: who hears of this run (default: the constructor's callbacks). Returns the
        answers if kept."""
        if events is not None:
            self._on_answers, self._on_tick = events.on_answers, events.tick
            self._on_threads, self._on_ready = events.on_threads, events.on_ready
        windows = WindowIntake(feed, feed_below)
        self._add(questions)
        self._lives.engines = engine
        if not self._stop_signal:  # stopped before the run: no worker gets work, none starts
            for w in self.workers:
                if w.link is not None:  # started early, waiting for its configuration
                    w.link.send(Configure(self._lives.engine_of(w)))
            self.start()  # the others get their configuration as they start
        next_tick = time.perf_counter() + TICK_S
        graceful = False
        try:
            while self._open or windows.to_come:
                self._tell_stop()
                if self._stop_signal and (time.perf_counter() >= self._stop_deadline or
                                          all(w.link is None for w in self.workers)):
                    if any(w.link is not None for w in self.workers):
                        self._wait_once(0.0)  # what they finished in the grace is in the pipes: kept
                    raise Interrupted(self._stop_signal)
                feeding = windows.to_come and not self._stop_signal
                if feeding:
                    self._add(windows.take(len(self._pending)))
                self._open.difference_update(withdraw(self._pending, windows.withdrawn()))  # no longer asked
                timeout = max(0.0, min(next_tick, self._stop_deadline or next_tick) - time.perf_counter())
                self._wait_once(windows.wait_s(timeout, feeding, len(self._pending)), windows.wake_fd)
                if time.perf_counter() >= next_tick:
                    next_tick = time.perf_counter() + TICK_S
                    if self._on_tick:
                        self._on_tick(self)
            self.finished = True
            if self._on_tick:  # a last sample while the workers are still alive
                self._on_tick(self)
            graceful = True
        finally:
            self._lives.shutdown(self.workers, graceful)
        return self.answers

    def reconfigure(self, engines: Mapping[int, EngineConfig]) -> None:
        """Every worker builds its engine here (a streamed file's later window needs a
        larger context: runner/plan/growth.py): each finishes the questions it holds and gets no new
        ones meanwhile, then builds it in place; a worker without one is let go once it has
        finished."""
        self._lives.reconfigure(self.workers, engines)
        self._dispatch()

    def _add(self, questions: Sequence[Question]) -> None:
        if questions:
            self._pending.extend(questions)
            self._open.update(q.qid for q in questions)
            self._dispatch()

    def request_stop(self, signum: int) -> None:
        """First call: finish in-flight questions for a short grace, then stop. Second: now.
        It is called inside a signal handler (runner/pool/signals.py), which may have interrupted
        any line of the run, a send on a worker's queue included: it only marks the stop, and
        run()'s loop tells the workers at its next turn (_tell_stop). Sending from here would
        take a queue's lock the interrupted send may hold: the run would hang for good."""
        if self._stop_signal:
            raise Interrupted(signum)
        self._stop_signal = signum
        self.paused = True

    def _tell_stop(self) -> None:
        """Once a stop is asked: every live worker is told to Stop, and the grace starts."""
        if not self._stop_signal or self._stop_deadline:
            return
        self._stop_deadline = time.perf_counter() + GRACE_S
        live = [w.link for w in self.workers if w.link is not None]
        for link in live:
            link.send(Stop())  # the worker finishes what is decoding, then exits
        if live:
            log.warning("stopping: questions already decoding get %.0f s to finish", GRACE_S)
        else:
            log.warning("stopping before any worker has started")

    def pause(self, paused: bool) -> None:
        """Stop (or resume) handing out questions; workers finish what they hold. A pool that
        is stopping stays paused."""
        if self._stop_signal:
            return
        self.paused = paused
        if not paused:
            self._dispatch()

    @property
    def stopping(self) -> bool:
        return bool(self._stop_signal)

    @property
    def in_flight(self) -> dict[int, int]:
        """worker id -> questions it holds, for each live worker."""
        return {w.spec.worker_id: len(w.in_flight) for w in self.workers if w.link is not None}

    @property
    def live_pids(self) -> dict[int, int]:
        """worker id -> pid of its live process, for those on this machine (psutil sees only them)."""
        pids = {w.spec.worker_id: w.link.pid for w in self.workers if w.link is not None}
        return {wid: pid for wid, pid in pids.items() if pid is not None}

    def llama_threads(self) -> dict[int, WorkerThreads]:
        """worker id -> its llama.cpp threads (runner/pool/worker_threads.py), for each live worker
        once run() has configured it."""
        if self._lives.engines is None:
            return {}
        return {w.spec.worker_id: w.threads.view(self._lives.engine_of(w).n_threads)
                for w in self.workers if w.link is not None}

    def slots(self) -> dict[int, int]:
        """worker id -> the sequences it decodes together, for each live worker once run() has
        configured it (it holds more questions than that: the next ones wait at the worker)."""
        if self._lives.engines is None:
            return {}
        return {w.spec.worker_id: self._lives.engine_of(w).slots for w in self.workers if w.link is not None}

    def set_threads(self, worker_id: int, n: int) -> None:
        """Ask a worker to run llama.cpp with n threads from its next step; it answers ThreadsSet."""
        w = next((x for x in self.workers if x.spec.worker_id == worker_id), None)
        if w is not None and w.link is not None:
            w.link.send(w.threads.ask(n))

    # -- event loop -----------------------------------------------------------------------------

    def _wait_once(self, timeout: float, wake: Optional[int] = None) -> None:
        events = self._backend.wait([w.link for w in self.workers if w.link is not None], timeout, wake)
        by_link = {id(w.link): w for w in self.workers if w.link is not None}
        dead = [(w, e.link) for e in events if e.died and (w := by_link.get(id(e.link))) is not None]
        # A dead worker's last words are often a WantWork: questions handed to it would go nowhere and
        # be suspects of its death (`dead` holds its link till the end: no new link takes its id).
        self._dead_links = {id(link) for _, link in dead}
        try:
            for event in events:
                for msg in event.messages:
                    self._handle(msg)
            for w, link in dead:  # deaths after every message: a worker may have spoken just before
                if w.link is link:  # not already let go of (or started again) while handling them
                    self._on_death(w)
        finally:
            self._dead_links = set()

    def _handle(self, msg: Any) -> None:
        w = next((x for x in self.workers if x.spec.worker_id == msg.worker_id), None)
        if w is None:  # a worker let go of (keep) that spoke before it went
            return
        if isinstance(msg, AnswerBatch):
            self._lives.model_file.check_answers(w.spec)  # answers from a model written over are not kept
            w.engine_stats = msg.step_stats
            for answer in msg.answers:
                w.in_flight.pop(answer.qid, None)
            self._record(msg.answers)
            if not w.in_flight:
                w.solo = False
            self._dispatch()
        elif isinstance(msg, WantWork):
            w.wants = msg.n
            self._dispatch()
        elif isinstance(msg, EngineStats):
            w.live = msg
        elif isinstance(msg, ThreadsSet):
            w.threads.answered(msg)
            if self._on_threads:
                self._on_threads(msg)
        elif isinstance(msg, Ready):
            w.ready = msg
            w.contexts += 1
            self._lives.on_ready(w)
            w.threads.started(msg.n_threads)
            if self.first_ready_at is None:
                self.first_ready_at = time.perf_counter()
            log.debug("worker %d: ready in %.2f s (pid %d, cores %s)", msg.worker_id, msg.load_s,
                      msg.pid, msg.cores)
            self._notes.say(w, msg, self.workers)
            if self._on_ready:
                self._on_ready(self, msg)
        elif isinstance(msg, WorkerError):
            w.last_error = f"{msg.kind}: {msg.message}"
            log.debug("worker %d (%s): %s\n%s", msg.worker_id, msg.stage, w.last_error, msg.traceback)
            if msg.model_load and msg.stage in ("load", "configure") and not self._lives.engine_made:
                # The model or its context cannot be made: every worker would fail the same way. Once
                # one has made it, a restart failing (memory still short after an OOM kill) is a death
                # like any other, for the crash budget.
                raise ModelError(msg.message)

    def _record(self, answers: Sequence[Answer]) -> None:
        # A requeued question may come back twice (its first worker's answer arriving after the
        # worker was given up on): keep the first.
        new = [a for a in answers if a.qid in self._open]
        for a in new:
            self._open.discard(a.qid)
            if self._keep_answers:
                self.answers[a.qid] = a
        self.n_answered += len(new)
        if new:
            self._lives.crashes.progress()
            self._on_answers(new)

    def _dispatch(self) -> None:
        if self.paused:
            return
        self._lives.restart_outdated(self.workers, self.stopping)
        live = [w for w in self.workers if w.link is not None and id(w.link) not in self._dead_links]
        for w in live:
            if w.link is None or w.wants <= 0 or w.solo or w.outdated:
                continue
            taken = next_chunk(w, live, self._pending, self._suspects)
            if taken is None:
                continue
            chunk, w.solo = taken
            for q in chunk:
                w.in_flight[q.qid] = q
            w.link.send(Chunk(chunk))
            w.wants = 0

    # -- deaths ---------------------------------------------------------------------------------

    def _on_death(self, w: WorkerState) -> None:
        if self._lives.on_death(w, self.workers, self.stopping, self.first_ready_at is not None, self._requeue):
            self._dispatch()

    def _requeue(self, failed: list[Answer], suspects: list[tuple[Question, ...]]) -> None:
        """A dead worker's questions: those that reached their limit failed, the others suspects."""
        self._suspects.extend(suspects)
        self._record(failed)
