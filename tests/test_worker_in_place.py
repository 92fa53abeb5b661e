"""A worker told to build a new engine while it holds nothing (the pool grown to a larger context)
builds it in place: the same process, its weights kept where they are loaded alike, loaded again
where the repack setting changes; it answers as a worker started afresh with that engine would.
The real worker loop (workers/main.py run_worker) on a thread, llama.cpp's engine on the demo
model; every test has a hard timeout."""

from __future__ import annotations

import os
import queue
import threading
from array import array
from typing import Any

import pytest

from ggbatch.workers.main import run_worker
from ggbatch.workers.protocol import (
    AnswerBatch,
    Chunk,
    Configure,
    EngineConfig,
    GenerationParams,
    Question,
    Ready,
    Stop,
    WorkerError,
    decode,
    encode,
)
from ggbatch.workers.spec import WorkerSpec

pytestmark = pytest.mark.model


class Results:
    """The worker's results pipe: its messages, decoded, as they come."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()

    def send_bytes(self, data: bytes) -> None:
        self.messages.put(decode(data))

    def answers(self, n: int) -> dict[str, str]:
        """The next n answers' texts, whatever else comes meanwhile (a Ready, stats, wants)."""
        out: dict[str, str] = {}
        while len(out) < n:
            msg = self.messages.get(timeout=60)
            assert not isinstance(msg, WorkerError), msg
            if isinstance(msg, AnswerBatch):
                out.update((a.qid, a.text) for a in msg.answers)
        return out

    def ready(self) -> Ready:
        while True:
            msg = self.messages.get(timeout=60)
            assert not isinstance(msg, WorkerError), msg
            if isinstance(msg, Ready):
                return msg


def engine(model: str, slots: int, repack: bool) -> EngineConfig:
    return EngineConfig(model_path=model, n_threads=1, slots=slots, n_ctx_seq=128, n_batch=64,
                        generation=GenerationParams(max_tokens=6, ignore_eos=True),
                        kv_unified=False, repack=repack)


def batch(tag: str) -> list[Question]:
    return [Question(f"{tag}{i}", array("i", [1, 20 + i, 30 + 2 * i, 7]), i) for i in range(5)]


def answers_of_a_new_worker(model: str, config: EngineConfig, questions: list[Question]) -> dict[str, str]:
    tasks: queue.Queue[bytes] = queue.Queue()
    results = Results()
    worker = threading.Thread(target=run_worker, args=(WorkerSpec(0, (0,), model, repack=config.repack), tasks,
                                                       results))
    worker.start()
    for msg in (Configure(config), Chunk(tuple(questions))):
        tasks.put(encode(msg))
    try:
        return results.answers(len(questions))
    finally:
        tasks.put(encode(Stop()))  # Stop drops the questions still waiting: only once all are answered
        worker.join(60)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("repack_after", [False, True], ids=["weights kept", "weights loaded again"])
def test_a_new_engine_is_built_in_place_and_answers_as_a_new_worker_would(demo_model, repack_after):
    first, second = engine(demo_model, 2, False), engine(demo_model, 4, repack_after)
    tasks: queue.Queue[bytes] = queue.Queue()
    results = Results()
    worker = threading.Thread(target=run_worker, args=(WorkerSpec(0, (0,), demo_model), tasks, results))
    worker.start()
    try:
        tasks.put(encode(Configure(first)))
        tasks.put(encode(Chunk(tuple(batch("a")))))
        was = results.ready()
        before = results.answers(5)
        tasks.put(encode(Configure(second)))  # it holds nothing now, as the pool waits for
        tasks.put(encode(Chunk(tuple(batch("b")))))
        now = results.ready()
        after = results.answers(5)
    finally:
        tasks.put(encode(Stop()))
        worker.join(60)
    assert not worker.is_alive()
    assert was.pid == now.pid == os.getpid() and now.load_s >= was.load_s
    assert before == answers_of_a_new_worker(demo_model, first, batch("a"))
    assert after == answers_of_a_new_worker(demo_model, second, batch("b"))
    assert all(after.values()) and len(set(after.values())) > 1, after
