"""What the coordinator does while the pool runs: with each batch of answers (journal them,
count them), and on each tick of the pool, about once a second (sample the workers and the
machine, pause admission when memory is low, say when a worker stalls, give up or take back
llama.cpp threads while other processes take a worker's cores, sync the journal, move the
progress line with the engines' token counters, and every few seconds add a sample to the run's
timeline)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from ...workers.protocol import Answer, EngineStats, Ready, ThreadsSet
from ..plan.cgroup_memory import system_memory
from ..pool.worker_threads import WorkerThreads
from .memory_guard import Admission, LowMemoryPause
from .monitor import Monitor
from .progress import Progress
from .stalls import StallWatch
from .startup_load import SinceStart
from .tally import AnswerTally
from .thread_controller import CoreLoad, ThreadChange, ThreadController, core_load
from .timeline import Sample, Timeline, WorkerPoint

log = logging.getLogger("ggbatch")


class WatchedPool(Admission, Protocol):
    """What the watch reads of the workers' pool and asks of it (runner/pool/pool.py WorkerPool)."""

    finished: bool  # every question answered; the workers are still alive

    @property
    def live_pids(self) -> dict[int, int]: ...

    @property
    def in_flight(self) -> dict[int, int]: ...

    def engine_counters(self) -> dict[int, EngineStats]: ...

    def llama_threads(self) -> dict[int, WorkerThreads]: ...

    def slots(self) -> dict[int, int]: ...

    def set_threads(self, worker_id: int, n: int) -> None: ...


class AnswerSink(Protocol):
    """Where the answers go as they come (a job's journal, runner/journal/journal.py; a warm
    pool's calls, runner/warm/calls.py)."""

    def append(self, answers: list[Answer]) -> None: ...

    def sync(self) -> None:
        """Once a tick: what was appended is made durable, if it can be."""

    def close(self) -> None: ...


class RunWatch:
    def __init__(self, progress: str, started: Optional[float] = None, adapt_threads: bool = True,
                 answers: Optional[AnswerSink] = None, since_start: Optional[SinceStart] = None,
                 on_memory: Optional[Callable[[str], None]] = None) -> None:
        """started: time.perf_counter() when the job started (the timeline's zero); adapt_threads:
        change llama.cpp's thread count under contention (the job's threads_adapt); answers:
        where they go (None: counted only); since_start: the cores' times taken before any worker
        started (runner/watch/startup_load.py; None: now); on_memory: told the model's memory with
        each worker's Ready (runner/questions/prepare.py SharingNote)."""
        self.progress = Progress(0, mode=progress)
        self.monitor = Monitor()
        # a share of the host's RAM, or of its cgroup's limit where that is less: the OOM killer acts on it
        self.memory_pause = LowMemoryPause(system_memory().total)
        self.stalls = StallWatch()
        self.timeline = Timeline()
        self.threads = ThreadController() if adapt_threads else None
        # Before any worker exists: what the cores do while they load is the controller's first evidence.
        self._since_start = (since_start or SinceStart()) if adapt_threads else None
        self._judged_ready: set[int] = set()  # workers whose load since the start was judged
        self.thread_changes: list[dict[str, Any]] = []  # as the workers made them, for the report
        self._asked: dict[int, ThreadChange] = {}  # changes asked of the workers, not answered yet
        self._other: dict[int, float] = {}  # worker id -> other load on its cores, last interval
        self.answers = answers
        self.tally = AnswerTally()  # the answers are in the journal; the report needs their numbers
        self.started = time.perf_counter() if started is None else started
        self.on_memory = on_memory

    def start_run(self, total: int, max_tokens: int, slots: int, pool: Optional[WatchedPool] = None) -> None:
        """The questions left to answer are known: the progress line and the timeline start.
        max_tokens: per answer; slots: decoded together over all workers. A sample of the pool's
        workers now makes the first tick's a whole interval: contention is seen a second sooner."""
        self.progress.total = total
        self.progress.max_tokens, self.progress.slots = max_tokens, slots
        self.timeline.add(Sample(time.perf_counter() - self.started, 0, 0))
        if pool is not None:
            self.monitor.sample(pool.live_pids)

    def on_answers(self, answers: list[Answer]) -> None:
        if self.answers is not None:
            self.answers.append(answers)
        self.tally.add(answers)
        self.progress.answered(answers)

    def tick(self, pool: WatchedPool) -> None:
        available = self.monitor.sample(pool.live_pids, final=pool.finished)
        self.memory_pause.update(available, pool)
        now, slots = time.monotonic(), pool.slots()
        for worker_id, n in pool.in_flight.items():
            usage = self.monitor.workers.get(worker_id)
            said = usage and self.stalls.sample(worker_id, usage.cpu_s, n, usage.state, now, slots.get(worker_id))
            if said:
                log.warning("%s", said)
        self._watch_threads(pool, now)
        if self.answers is not None:
            self.answers.sync()
        counters = pool.engine_counters()
        # the engines send their counters every 0.5 s, the answers come at once: never fewer
        # tokens than the answers in hold
        self.progress.tokens(max(sum(c.generated_tokens for c in counters.values()), self.tally.generated_tokens),
                             sum(c.prompt_tokens for c in counters.values()))
        t = time.perf_counter() - self.started
        if self.timeline.due(t) or pool.finished:
            self.timeline.add(self._sample(t, counters, pool.llama_threads()))
        self.progress.tick()

    def end(self, pool: WatchedPool) -> None:
        """The timeline's last sample, for a run the pool did not finish (a stop, a worker's
        failure): a finished pool's last tick took it."""
        if not pool.finished:
            self.timeline.add(self._sample(time.perf_counter() - self.started, pool.engine_counters(),
                                           pool.llama_threads()))

    def on_threads(self, msg: ThreadsSet) -> None:
        """A worker's answer to a change of its llama.cpp threads: logged and reported once made."""
        asked = self._asked.pop(msg.worker_id, None)
        if msg.n_threads == msg.before:
            return
        why = asked.reason if asked is not None else "no reason recorded"
        self.thread_changes.append({"t_s": round(time.perf_counter() - self.started, 2), "worker": msg.worker_id,
                                    "from": msg.before, "to": msg.n_threads, "reason": why,
                                    "after_steps": msg.steps})
        log.info("worker %d: %d → %d llama.cpp threads: %s%s", msg.worker_id, msg.before, msg.n_threads, why,
                 "" if msg.steps else "; before its first step")

    def _watch_threads(self, pool: WatchedPool, now: float) -> None:
        """Feed each worker's last interval to the thread controller; ask for what it decides."""
        self._other.clear()
        for wid, threads in pool.llama_threads().items():
            usage = self.monitor.workers.get(wid)
            load = usage and core_load(self.monitor.cores, usage.affinity, usage.interval_cpu_s)
            if not usage or not load or load.interval_s <= 0:  # two samples within the clock's tick: nothing to judge
                continue
            self._other[wid] = load.other
            self._judge(pool, wid, now, load, threads, usage.affinity)

    def on_ready(self, pool: WatchedPool, msg: Ready) -> None:
        """A worker has loaded: the load on its cores since the job started is the thread
        controller's first evidence (runner/watch/startup_load.py), so that on a busy machine its first
        step, the prompts, already runs fewer threads. Once per worker: a restarted one is left to
        the ticks, the interval since the start being mostly the run's by then."""
        if self.on_memory is not None:
            self.on_memory(msg.memory)
        if self._since_start is None or msg.worker_id in self._judged_ready:
            return
        self._judged_ready.add(msg.worker_id)
        pids, threads = pool.live_pids, pool.llama_threads().get(msg.worker_id)
        if msg.worker_id not in pids or threads is None:  # a Ray actor: not this machine's cores
            return
        load = self._since_start.load(pids[msg.worker_id], msg.cores, pids.values())
        if load is not None and load.interval_s > 0:
            self._judge(pool, msg.worker_id, time.monotonic(), load, threads, msg.cores, at_ready=True)

    def _judge(self, pool: WatchedPool, wid: int, now: float, load: CoreLoad, threads: WorkerThreads,
               cores: Sequence[int], at_ready: bool = False) -> None:
        """Feed one interval of a worker's cores to the thread controller (and -v's log); ask the
        worker for what it decides."""
        log.debug("worker %d: cores %s over %.2f s%s: %.2f busy, %.2f its own, %.2f other (%.2f steal) "
                  "cores; %d llama.cpp threads", wid, list(cores), load.interval_s,
                  " from the job's start to its Ready" if at_ready else "", load.busy_s / load.interval_s,
                  load.own_s / load.interval_s, load.other, load.steal, threads.current)
        if self.threads is None or not threads.settable or pool.finished or pool.stopping:
            return
        change = self.threads.sample(wid, now, load, threads.current, threads.ceiling, at_ready)
        if change is not None:
            self._asked[wid] = change
            pool.set_threads(wid, change.to)

    def _sample(self, t: float, counters: dict[int, EngineStats], threads: dict[int, Any]) -> Sample:
        points = {}
        for wid in sorted(set(counters) | set(self.monitor.workers)):
            c, usage = counters.get(wid), self.monitor.workers.get(wid)
            generated = max(c.generated_tokens if c else 0, self.tally.of_worker(wid)["generated_tokens"])
            points[wid] = WorkerPoint(generated, c.prompt_tokens if c else 0,
                                      c.steps if c else 0, c.busy_slots if c else 0,
                                      usage.total_cpu_s if usage else None, usage.pss if usage else 0,
                                      usage.threads if usage else 0,
                                      threads[wid].current if wid in threads else None, self._other.get(wid))
        return Sample(t, self.progress.done, self.progress.failed, points)

    def close(self) -> None:
        self.progress.close()
        if self.answers is not None:
            self.answers.close()

    def __enter__(self) -> "RunWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
