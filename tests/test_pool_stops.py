"""A stop of the pool across real spawned processes (the fake engine): a signal in the middle of
a send, the grace that in-flight questions get and what is kept when it runs out."""

import signal
import time

import pytest

from fake_engine import Fake
from ggbatch.runner.errors import Interrupted
from ggbatch.runner.pool import pool as pool_module
from ggbatch.runner.pool.local import LocalBackend
from ggbatch.runner.pool.pool import GRACE_S, TICK_S, WorkerPool
from ggbatch.runner.pool.signals import STOP
from ggbatch.workers.protocol import Chunk
from test_pool import qs, specs

pytestmark = pytest.mark.timeout(60)


class SignalledMidSend(LocalBackend):
    """Local workers whose links take SIGTERM inside a send, as a signal that comes while the run
    hands a worker its configuration or a chunk: the handler runs before the send has returned.
    A handler that sent too would re-enter the queue's put, whose lock the interrupted send holds:
    the run hung for good (seen once in CI, a SIGTERM at 0.8 s)."""

    def __init__(self):
        super().__init__()
        self.reentered = []  # what was sent inside another send

    def start(self, spec):
        link = super().start(spec)
        plain_send, sending = link.send, [False]

        def send(msg):
            if sending[0]:
                self.reentered.append(type(msg).__name__)
            sending[0] = True
            try:
                if isinstance(msg, Chunk):
                    signal.raise_signal(signal.SIGTERM)  # its Python handler runs here, inside this send
                plain_send(msg)
            finally:
                sending[0] = False

        link.send = send
        return link


def test_a_signal_in_the_middle_of_a_send_stops_the_run_within_its_grace():
    worker_specs, engine = specs(2, Fake(slow=0.05))
    backend = SignalledMidSend()
    pool = WorkerPool(worker_specs, backend=backend)
    start = time.perf_counter()
    with pytest.raises(Interrupted) as stopped, STOP.run():
        STOP.attach(pool)
        pool.run(qs(200), engine)
    assert stopped.value.signum == signal.SIGTERM
    assert time.perf_counter() - start < GRACE_S + TICK_S + 10  # the workers' start, then the grace
    assert backend.reentered == []
    assert pool.n_answered < 200  # what had not started decoding was never answered
    assert all(w.link is None for w in pool.workers)


class BusyUntilTheGraceEnds(LocalBackend):
    """Local workers whose pool, once stopping, hears nothing from them until its grace has run
    out, as a coordinator busy or descheduled then: what they sent meanwhile waits in the pipes."""

    def __init__(self):
        super().__init__()
        self.pool = None

    def wait(self, links, timeout, wake=None):
        deadline = self.pool._stop_deadline if self.pool is not None and self.pool.stopping else None
        if deadline and time.perf_counter() < deadline:
            time.sleep(timeout)
            return []
        return super().wait(links, timeout, wake)


def test_answers_sent_within_the_grace_are_kept_when_it_runs_out(monkeypatch):
    """The grace ran out and the run stopped without a last read: the answers the workers had
    finished in it were computed and lost, never journaled."""
    # a grace long enough for the worker's 0.3 s answers on a loaded machine (2 s ran out first)
    monkeypatch.setattr(pool_module, "GRACE_S", 6.0)
    worker_specs, engine = specs(1, Fake(slow=0.3), slots=4)
    backend = BusyUntilTheGraceEnds()
    after_stop = []

    def on_answers(answers):
        if pool.stopping:
            after_stop.extend(a.qid for a in answers)
        else:
            pool.request_stop(signal.SIGTERM)

    pool = backend.pool = WorkerPool(worker_specs, backend=backend, on_answers=on_answers)
    with pytest.raises(Interrupted):
        pool.run(qs(40), engine)
    assert after_stop  # the questions the worker held when told to stop, answered in its grace
    assert set(after_stop) <= set(pool.answers) and pool.n_answered < 40
