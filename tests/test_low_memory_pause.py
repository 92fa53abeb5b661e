"""The low-memory pause ends when pausing has freed all it can: the run's own idle workers
holding the memory (their KV caches) is no reason to wait for good."""

from array import array

import pytest

from fake_engine import Fake
from ggbatch.runner.pool.pool import WorkerPool
from ggbatch.runner.watch.memory_guard import LowMemoryPause
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
from ggbatch.workers.spec import WorkerSpec

MIB = 1 << 20
RAM = 1000 * MIB


class Pool:
    """The admission interface the pause drives (WorkerPool's), with the questions each live worker holds."""

    def __init__(self, in_flight: dict[int, int]) -> None:
        self.paused = self.stopping = self.finished = False
        self.in_flight = in_flight

    def pause(self, paused: bool) -> None:
        self.paused = paused


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "ggbatch"]


@pytest.mark.timeout(60)
def test_a_pause_the_runs_own_workers_cause_ends_and_every_question_is_answered(caplog):
    # What a job short of memory sees once its workers hold the KV caches the plan gave them:
    # 4 % of RAM left, under the 5 % threshold, and nothing the pause waits for gives any back.
    guard, answered = LowMemoryPause(RAM), []
    engine = EngineConfig(model_path="fake.gguf", n_threads=1, slots=4, n_ctx_seq=64, n_batch=64,
                          generation=GenerationParams())
    pool = WorkerPool([WorkerSpec(i, (0,), "fake.gguf", engine_factory=Fake(slow=0.2)) for i in range(2)],
                      on_answers=lambda answers: answered.extend(a.qid for a in answers),
                      on_tick=lambda p: guard.update(RAM if len(answered) < 40 else 40 * MIB, p))
    with caplog.at_level("WARNING", logger="ggbatch"):
        pool.run([Question(f"q{i}", array("i", range(i % 7 + 1)), i) for i in range(200)], engine)
    assert sorted(answered) == sorted(f"q{i}" for i in range(200))
    assert guard.pauses == 1 and not pool.paused
    said = [m for m in messages(caplog) if "available" in m]
    assert said == ["only 40 MiB available: admitting no new questions until memory recovers",
                    "40 MiB available with no question in flight: pausing has freed all it can (idle workers "
                    "keep their KV caches; the rest is held by them or by other processes). Admitting "
                    "questions again; pausing again under 20 MiB. Should a worker be killed out of memory, "
                    "fewer --slots or a smaller --n-ctx make the job fit"]


def test_the_pause_waits_while_questions_in_flight_can_still_give_memory_back(caplog):
    guard, pool = LowMemoryPause(RAM), Pool({0: 3, 1: 0})
    guard.update(40 * MIB, pool)
    guard.update(30 * MIB, pool)
    assert pool.paused  # worker 0 still decodes: its questions' end may free what the pause waits for
    pool.in_flight = {}  # every worker restarting: the one that starts holds nothing yet either
    guard.update(30 * MIB, pool)
    assert pool.paused
    pool.in_flight, pool.finished = {0: 0, 1: 0}, True  # every question answered: nothing to admit
    caplog.clear()
    with caplog.at_level("WARNING", logger="ggbatch"):
        guard.update(30 * MIB, pool)
    assert pool.paused and messages(caplog) == []


def test_after_the_baseline_another_process_taking_memory_still_pauses_the_run(caplog):
    guard, pool = LowMemoryPause(RAM), Pool({0: 2})
    guard.update(40 * MIB, pool)
    pool.in_flight = {0: 0}
    guard.update(40 * MIB, pool)  # drained: 40 MiB is what the idle run leaves
    assert not pool.paused and guard.low == 20 * MIB
    guard.update(25 * MIB, pool)
    assert not pool.paused  # the run's own use, with room to spare: no pause
    caplog.clear()
    with caplog.at_level("WARNING", logger="ggbatch"):
        guard.update(15 * MIB, pool)  # something else took memory: under half the baseline
        assert pool.paused and guard.pauses == 2
        pool.in_flight = {0: 1}
        guard.update(41 * MIB, pool)  # given back, past the baseline
    assert not pool.paused
    assert messages(caplog) == ["only 15 MiB available: admitting no new questions until memory recovers",
                                "41 MiB available again: admitting questions"]
