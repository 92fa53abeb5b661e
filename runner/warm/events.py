"""What a warm pool's one long run tells (WorkerPool.run's events): answers, ticks and thread
changes go to the pool's watch, and the pool hears when every worker is Ready (Pool.starting
hands the caller a pool before then)."""

from __future__ import annotations

from typing import Callable

from ...workers.protocol import Answer, Ready, ThreadsSet
from ..pool.pool import WorkerPool
from ..watch.watch import RunWatch


class PoolEvents:
    def __init__(self, watch: RunWatch, on_ready: Callable[[], None]) -> None:
        self._watch, self._on_ready = watch, on_ready

    def on_answers(self, answers: list[Answer]) -> None:
        self._watch.on_answers(answers)

    def tick(self, workers: WorkerPool) -> None:
        self._watch.tick(workers)

    def on_threads(self, msg: ThreadsSet) -> None:
        self._watch.on_threads(msg)

    def on_ready(self, workers: WorkerPool, msg: Ready) -> None:
        self._watch.on_ready(workers, msg)
        self._on_ready()
