"""The workers' lives: starting each (configured with its engine once the run has given one),
stopping it, restarting it after a death or when a reconfigure outdates its engine, letting go of
it, and what a death costs. WorkerPool (runner/pool/pool.py) holds one WorkerLives and tells it
of each death; the pool's dispatch and messages never start or end a worker themselves.

When a worker dies, every question it held is a suspect. Suspects are retried alone on a worker,
in groups halved at each death (runner/pool/crashes.py), until a death names its culprit
exactly; its innocent batch-mates are answered. A dead worker is restarted; what deaths may cost
before the run gives up is runner/pool/crashes.py's decision. Each local worker's stderr goes to
a log file of its own, whose last line is quoted when it dies (llama.cpp writes its asserts there).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Callable, Collection, Mapping, Optional, Sequence, Union

from ...workers.protocol import Answer, Configure, EngineConfig, Question, Stop
from ...workers.spec import WorkerSpec
from ..model.identity import ModelIdentity
from .backend import Backend
from .crashes import CrashBudget, Death
from .log_dirs import make_log_dir
from .model_file import ModelFile
from .worker_state import WorkerState, on_node

log = logging.getLogger("ggbatch")

# What the pool does with a dead worker's questions: record the answers failing those that reached
# their limit, queue the groups of suspects to retry (runner/pool/crashes.py).
Requeue = Callable[[list[Answer], list[tuple[Question, ...]]], None]


class WorkerLives:
    def __init__(self, backend: Backend[Any], n_workers: int, model: Optional[ModelIdentity] = None) -> None:
        self.backend = backend
        self.model_file = ModelFile(model)  # the file the run's answers come from, watched
        self.crashes = CrashBudget(n_workers)  # its limits: runner/pool/crashes.py
        self.log_dir = make_log_dir()
        self.engines: Union[EngineConfig, Mapping[int, EngineConfig], None] = None  # from the run on
        self.leaving: set[int] = set()  # workers a reconfigure lets go once they have finished
        self.engine_made = False  # a worker has been ready with the engine now given (since a reconfigure)

    def log_path(self, spec: WorkerSpec) -> str:
        """Where this worker's stderr goes, over all its lives."""
        return os.path.join(self.log_dir, f"worker-{spec.worker_id}.log")

    def engine_of(self, w: WorkerState) -> EngineConfig:
        engines = self.engines
        if engines is None:
            raise RuntimeError(f"worker {w.spec.worker_id} started before the run gave the engine's settings")
        return engines if isinstance(engines, EngineConfig) else engines[w.spec.worker_id]

    def start(self, w: WorkerState) -> None:
        """A new life of the worker."""
        self.model_file.check_start(w.spec)
        if w.spec.log_path:
            open(w.spec.log_path, "w").close()  # last words are this life's only
        w.link = self.backend.start(w.spec)
        w.awaiting_engine()
        if self.engines is not None:  # a restart during the run: configure it at once
            w.link.send(Configure(self.engine_of(w)))

    def on_ready(self, w: WorkerState) -> None:
        """Worker w is ready: the engine is made (unless w started before a reconfigure gave a new one)."""
        if not w.outdated:
            self.engine_made = True

    def keep(self, workers: Sequence[WorkerState], worker_ids: Collection[int]) -> list[WorkerState]:
        """Let go of the workers not named (the memory plan wants fewer): the workers kept. They are
        killed: they hold nothing yet, and one reads Stop only once it has loaded the whole model."""
        for w in workers:
            if w.spec.worker_id not in worker_ids:
                self.stop(w, graceful=False)
        kept = [w for w in workers if w.spec.worker_id in worker_ids]
        self.crashes.resize(len(kept))
        return kept

    def stop(self, w: WorkerState, graceful: bool, timeout: float = 5.0) -> None:
        if w.link is not None:
            if graceful:
                w.link.send(Stop())
                w.link.join(timeout)
            w.link.kill()
            w.link = None

    def reconfigure(self, workers: Sequence[WorkerState], engines: Mapping[int, EngineConfig]) -> None:
        """Every live worker is outdated: it builds its engine here once it holds
        nothing (restart_outdated); a worker without one is let go then."""
        old = self.engines
        ids = [w.spec.worker_id for w in workers]
        self.leaving = {wid for wid in ids if wid not in engines}
        self.crashes.resize(len(ids) - len(self.leaving))
        # A worker let go keeps its engine until it has finished (the thread monitor reads it).
        earlier: Mapping[int, EngineConfig] = (old if isinstance(old, Mapping)
                                               else {} if old is None else dict.fromkeys(ids, old))
        self.engines = {**earlier, **engines}
        self.engine_made = False  # a larger context may not fit where the smaller did
        for w in workers:
            w.outdated = w.link is not None

    def restart_outdated(self, workers: Sequence[WorkerState], stopping: bool) -> None:
        """The outdated workers that hold nothing now build their new engine in place, in the same
        process on the weights it loaded (workers/main.py _Engines); a worker let go ends (a
        stopping pool changes none: the journal keeps what they answered). One still building an
        engine is told once its Ready has come: that Ready answers the engine it builds, and a
        Configure sent sooner would have it taken for the new one's."""
        for w in workers:
            if not w.outdated or w.in_flight or w.link is None or w.ready is None or stopping:
                continue
            # It holds nothing, and its counters came before its last answers: its engine's
            # counters start again from nothing, and this life's join its earlier ones'.
            w.end_life()
            if w.spec.worker_id in self.leaving:
                self.stop(w, graceful=False)
                w.outdated = False
                continue
            w.awaiting_engine()
            w.link.send(Configure(self.engine_of(w)))

    def on_death(self, w: WorkerState, workers: Sequence[WorkerState], stopping: bool, any_ready: bool,
                 requeue: Requeue) -> bool:
        """A worker died: what is left of it let go of, the death accounted for, the questions it
        held handed to `requeue`, and the worker started again unless the crash budget says no or
        a reconfigure let it go. Raises the error ending the run when the budget says so. Returns
        whether the pool should hand out questions now (it was started again or let go)."""
        if w.link is None:  # already let go of
            return False
        how, words = w.link.how_it_died()
        w.link.kill()  # let go of what is left of it (a pipe, a queue, a Ray actor)
        w.link = None
        if stopping:  # it exited as told: nothing to redo now, the journal has the rest
            return False
        death = Death(w.spec.worker_id, how, w.last_error or words, before_ready=w.ready is None)
        lost = list(w.in_flight.values())
        w.in_flight.clear()
        w.end_life()
        w.solo, w.last_error = False, ""
        requeue(*self.crashes.death(death, lost))
        n_live = sum(x.link is not None for x in workers)
        verdict = self.crashes.give_up(death, any_ready, n_live)
        if verdict is not None:
            raise verdict  # it says which worker died and how
        log.warning("worker %d%s died (%s)%s; %d questions go back to the queue", death.worker_id,
                    on_node(w.spec), death, death.limit(), len(lost))
        if not self.crashes.may_restart(w.spec.worker_id):
            log.warning("worker %d cannot start (%s): going on without it", death.worker_id, death)
            return False
        if w.spec.worker_id in self.leaving:  # a larger context's plan let it go
            return True
        w.restarts += 1
        self.start(w)
        return True

    def shutdown(self, workers: Sequence[WorkerState], graceful: bool) -> None:
        """Graceful: every worker is idle and exits on Stop (told all at once, then joined).
        Otherwise (interrupted, error, nothing to do) they are killed: waiting for them would
        mean waiting for work nobody will collect."""
        try:
            if graceful:
                for w in workers:
                    if w.link is not None:
                        w.link.send(Stop())
                deadline = time.monotonic() + 5.0
                for w in workers:
                    if w.link is not None:
                        w.link.join(max(0.0, deadline - time.monotonic()))
            for w in workers:
                self.stop(w, graceful=False)  # kills whatever is still alive
        finally:
            self.model_file.close()
            shutil.rmtree(self.log_dir, ignore_errors=True)
