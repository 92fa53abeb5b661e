"""The pool when a worker dies while the coordinator is not looking: what it hands out, what a
death costs, and letting go of workers (real spawned processes, the fake engine)."""

import os
import re
import signal
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from fake_engine import Fake, FakeEngine
from ggbatch.runner.pool.crashes import StartupError
from ggbatch.runner.pool.pool import WorkerPool
from ggbatch.workers.llama.load_errors import ModelLoadError
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
from ggbatch.workers.spec import WorkerSpec

pytestmark = pytest.mark.timeout(60)


def engine(slots=2):
    return EngineConfig(model_path="fake.gguf", n_threads=1, slots=slots, n_ctx_seq=64, n_batch=64,
                        generation=GenerationParams())


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
    pool = WorkerPool([WorkerSpec(0, (0,), "fake.gguf", engine_factory=Fake(slow=0.05))])
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


@dataclass(frozen=True)
class TightRestart(Fake):
    """Every worker's first start makes its context; once `gate` exists (memory got short after
    an OOM kill, a dead GPU worker's memory not given back yet), making one fails as llama.cpp's
    does."""
    gate: str = ""

    def build(self, config, worker_id):
        if self.gate and Path(self.gate).exists():
            raise ModelLoadError("m.gguf: not enough memory to make a context of 64 tokens × 2 sequences")
        return FakeEngine(config, worker_id, self)


def test_a_worker_that_cannot_make_its_context_again_is_a_death_not_the_end_of_the_run(tmp_path, caplog):
    gate = tmp_path / "memory-short"
    pool = WorkerPool([WorkerSpec(i, (0,), "fake.gguf", engine_factory=TightRestart(slow=0.02, gate=str(gate)))
                       for i in range(2)])

    def on_answers(answers):
        if pool.n_answered >= 50 and not gate.exists():
            gate.touch()
            os.kill(pool.live_pids[1], signal.SIGKILL)  # the OOM killer takes worker 1

    pool._on_answers = on_answers
    with caplog.at_level("WARNING", logger="ggbatch"):
        answers = pool.run(qs(300), engine())  # worker 0 answers the rest: no ModelError
    assert gate.exists()
    assert sorted(answers) == sorted(f"q{i}" for i in range(300))
    assert all(a.error is None for a in answers.values())
    assert any(r.getMessage().startswith("worker 1 cannot start (") and "not enough memory" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_workers_let_go_of_before_the_run_leave_the_crash_budget():
    # Four workers started, the memory plan keeps one, whose engine cannot start: as with one
    # worker started, no worker could ever start (StartupError, exit 2), not "no worker can
    # start any more" (WorkerFailure, exit 1) as if three more workers had been there to try.
    pool = WorkerPool([WorkerSpec(i, (0,), "fake.gguf", engine_factory=Fake(fail_load=True)) for i in range(4)])
    pool.start()
    pool.keep({0})
    with pytest.raises(StartupError, match=r"workers cannot start: worker 0 died while starting"):
        pool.run(qs(10), engine())


@dataclass(frozen=True)
class SlowLoad(Fake):
    """Reads its model for a long while, as a large one from a cold disk."""
    load_s: float = 20.0

    def preload(self, model_path, repack, n_gpu_layers, one_device):
        time.sleep(self.load_s)
        return n_gpu_layers, 0


def test_workers_let_go_of_while_loading_the_model_go_at_once():
    # A worker reads Stop only once it has loaded the model: asking it to stop waited for that,
    # 5 s each, one after another (15 s for three). They hold nothing: they are killed.
    pool = WorkerPool([WorkerSpec(i, (0,), "fake.gguf", engine_factory=SlowLoad()) for i in range(4)])
    with pool:
        pool.start()
        pids = dict(pool.live_pids)
        t0 = time.monotonic()
        pool.keep({0})
        assert time.monotonic() - t0 < 3.0
        assert [w.spec.worker_id for w in pool.workers] == [0]
        assert not any(psutil.pid_exists(pids[i]) for i in (1, 2, 3))
