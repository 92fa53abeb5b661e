"""The local backend: each worker a spawned process on this machine, talking to the pool
(runner/pool/pool.py) through a task queue and a results pipe of its own.

    pool ── send(msg) ──▶ task queue ──▶ worker process (workers/main.py worker_main)
    pool ◀── wait() ◀── results pipe (one per worker) + the process's sentinel

Each worker writes to a pipe of its own, whose writing end only it holds. A shared queue would
need a lock between writers, and a worker killed while holding it (kill -9, the OOM killer)
would block every other worker's next answer forever; with its own pipe, a worker killed in the
middle of a message leaves a torn message that reads as the end of the pipe. Deaths are noticed
by waiting on the process sentinels, not by polling. The pipe is read without blocking
(runner/child_pipes.py): a worker stopped in the middle of a long message holds up only itself.

It implements runner/pool/backend.py's Backend; runner/pool/ray.py is the other one.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import multiprocess as mp
from multiprocess.connection import wait as wait_any

from ...workers.main import worker_main
from ...workers.protocol import decode, encode
from ...workers.spec import WorkerSpec
from ..child_pipes import FrameReader
from ..child_processes import exit_reason, release_names, release_queue, start_child
from ..errors import open_files_limit_named
from ..plan.nodes import Node, local_node
from .backend import Event
from .crashes import last_words
from .wake import drain


class LocalLink:
    """One life of one worker process."""

    def __init__(self, ctx: Any, spec: WorkerSpec) -> None:
        self.spec = spec
        self._names_released = False
        with open_files_limit_named():
            self.tasks = ctx.Queue()
            reader, writer = ctx.Pipe(duplex=False)
            self.results: Optional[FrameReader] = FrameReader(reader)
            self.process = ctx.Process(target=worker_main, args=(spec, self.tasks, writer),
                                       name=f"ggbatch-worker-{spec.worker_id}", daemon=True)
            start_child(self.process)
        writer.close()  # the worker holds the only writing end: its death closes the pipe

    @property
    def pid(self) -> Optional[int]:
        """Its pid while alive, for psutil (runner/watch/monitor.py)."""
        return self.process.pid if self.process.is_alive() else None

    def send(self, msg: Any) -> None:
        if self.tasks is not None:
            self.tasks.put(encode(msg))

    def join(self, timeout: Optional[float] = None) -> None:
        self.process.join(timeout)

    def kill(self) -> None:
        """End this life now (if it has not ended) and let go of its queue and pipe; idempotent."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        if self.tasks is not None:
            release_queue(self.tasks)
            self.tasks = None
        self._close_results()

    def how_it_died(self) -> tuple[str, str]:
        """(how: "signal 9", "exit code 1"; its last words on stderr)."""
        self.process.join()
        return exit_reason(self.process.exitcode), last_words(self.spec.log_path)

    def drain(self) -> list[Any]:
        """The messages whole in the pipe now (a partial one waits for the next drain); at the end
        of the pipe, a torn one (the worker died writing it) is dropped and the pipe closed."""
        if self.results is None:
            return []
        out = [decode(frame) for frame in self.results.read()]
        if self.results.ended:
            self._close_results()
        if out and not self._names_released and self.tasks is not None:
            # the worker has started, its queue's semaphores opened: their names can go
            release_names(self.tasks)
            self._names_released = True
        return out

    def _close_results(self) -> None:
        if self.results is not None:
            self.results.close()
            self.results = None


class LocalBackend:
    """Worker processes on this machine, started with the spawn method."""

    name = "local"

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")

    def nodes(self) -> list[Node]:
        return [local_node()]

    def start(self, spec: WorkerSpec) -> LocalLink:
        return LocalLink(self._ctx, spec)

    def wait(self, links: Sequence[LocalLink], timeout: float, wake: Optional[int] = None) -> list[Event[LocalLink]]:
        readers = {link.results: link for link in links if link.results is not None}
        sentinels = {link.process.sentinel: link for link in links}
        ready = wait_any([*readers, *sentinels, *([] if wake is None else [wake])], timeout)
        if wake is not None and wake in ready:
            drain(wake)
        events: dict[int, Event[LocalLink]] = {id(readers[r]): Event(readers[r], readers[r].drain())
                                               for r in ready if r in readers}
        for s in ready:
            if s in sentinels:
                link = sentinels[s]
                # Drain first: the worker may have sent answers or its error just before dying.
                event = events.setdefault(id(link), Event(link, []))
                event.messages.extend(link.drain())
                event.died = True
        return list(events.values())

    def close(self) -> None:
        pass

    def __enter__(self) -> "LocalBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
