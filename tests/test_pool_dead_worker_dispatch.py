"""The pool when a worker dies while the coordinator is not looking: what it hands out, what a
death costs, and letting go of workers (real spawned processes, the fake engine)."""

import os
import re
import signal
import time
from array import array

import psutil
import pytest

from fake_engine import Fake
from ggbatch.runner.pool.pool import WorkerPool
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
from ggbatch.workers.spec import WorkerSpec

pytestmark = pytest.mark.timeout(60)


def engine(slots=2):
    return EngineConfig("fake.gguf", 1, slots, 64, 64, array("i"), GenerationParams())


def qs(n):
    return [Question(f"q{i}", array("i", range(5)), i) for i in range(n)]


def kill_and_reap_wait(pid):
    """SIGKILL a worker and wait until the kernel has ended it (a zombie: its pipe and sentinel
    are closed), without reaping it: the pool must see the death itself."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the worker did not die"
        time.sleep(0.01)


def test_a_worker_that_asked_for_work_and_died_is_given_none(caplog):
    # The coordinator is busy (here in its tick; in a run, a journal's fsync) while its one worker
    # answers all it holds, asks for more and is killed: its WantWork and its death arrive in one
    # wait. The questions must stay pending, not go to the dead worker and come back as suspects.
    pool = WorkerPool([WorkerSpec(0, (0,), "fake.gguf", Fake(slow=0.05))])
    killed = []

    def tick(p):
        if killed or p.n_answered == 0:
            return
        time.sleep(1.0)  # the worker runs dry: its last message is a WantWork nobody has read
        pid = p.live_pids[0]
        kill_and_reap_wait(pid)
        killed.append(pid)

    pool._on_tick = tick
    with caplog.at_level("WARNING", logger="ggbatch"):
        answers = pool.run(qs(80), engine())
    assert killed
    deaths = [r.getMessage() for r in caplog.records if "go back to the queue" in r.getMessage()]
    assert len(deaths) == 1 and re.search(r"; 0 questions go back to the queue$", deaths[0]), deaths
    assert sorted(answers) == sorted(f"q{i}" for i in range(80))
    assert all(a.error is None for a in answers.values())
