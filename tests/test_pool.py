"""The pool across real spawned processes, with the fake engine (same interface as the real one)."""

import time
from array import array
from dataclasses import replace

import pytest

from fake_engine import Fake
from ggbatch.runner.errors import ModelError, WorkerFailure
from ggbatch.runner.pool.crashes import StartupError
from ggbatch.runner.pool.local import LocalBackend
from ggbatch.runner.pool.pool import WorkerPool
from ggbatch.runner.pool.worker_threads import WorkerThreads
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question, ThreadsSet
from ggbatch.workers.spec import WorkerSpec
from helpers import write_jsonl

pytestmark = pytest.mark.timeout(60)


def specs(n_workers, fake=Fake(), slots=4):
    engine = EngineConfig(model_path="fake.gguf", n_threads=1, slots=slots, n_ctx_seq=64, n_batch=64,
                          generation=GenerationParams())
    return [WorkerSpec(i, (0,), "fake.gguf", engine_factory=fake) for i in range(n_workers)], engine


def qs(n):
    return [Question(f"q{i}", array("i", range(i % 7 + 1)), i) for i in range(n)]


def run(pool_specs, questions):
    worker_specs, engine = pool_specs
    seen = []
    pool = WorkerPool(worker_specs, on_answers=lambda answers: seen.extend(a.qid for a in answers))
    answers = pool.run(questions, engine)
    return pool, answers, seen


def test_every_question_answered_exactly_once():
    pool, answers, seen = run(specs(2), qs(300))
    assert sorted(seen) == sorted(f"q{i}" for i in range(300))
    assert answers["q5"].text == "answer to q5 (6 tokens)"
    assert all(w.link is None for w in pool.workers)  # every worker ended and let go of


def test_dispatch_keeps_all_workers_busy():
    pool, answers, _ = run(specs(2, Fake(slow=0.005), slots=2), qs(200))
    per_worker = [sum(1 for a in answers.values() if a.worker_id == w) for w in (0, 1)]
    assert min(per_worker) >= 60, per_worker  # pull-based: neither worker starves


def test_the_last_questions_are_shared_evenly():
    # 32 questions, two workers of 16 slots, a step of 2 s: both are ready long before the first
    # step ends. Each takes an even share of all that is unanswered, counting what it holds: 16
    # each in one step, where an even share of the pending alone (16 to the first to ask, then
    # halves of the rest to whoever asked) split them 21/11 here: two steps for one worker.
    pool, answers, _ = run(specs(2, Fake(slow=2.0), slots=16), qs(32))
    assert sorted(sum(1 for a in answers.values() if a.worker_id == w) for w in (0, 1)) == [16, 16]


def test_dead_worker_questions_go_to_the_queue_again(tmp_path):
    marker = tmp_path / "died"
    pool, answers, seen = run(specs(2, Fake(exit_after=5, marker=str(marker))), qs(100))
    assert marker.exists()
    assert sorted(seen) == sorted(f"q{i}" for i in range(100))  # nothing lost, nothing twice
    assert sum(w.restarts for w in pool.workers) >= 1
    assert all(a.error is None for a in answers.values())


def test_question_that_keeps_killing_workers_is_failed_not_retried_forever():
    pool, answers, _ = run(specs(2, Fake(segv_on="q3")), qs(20))
    assert answers["q3"].error.startswith("a worker died 2 times while answering it alone (last: signal 11)")
    assert all(answers[f"q{i}"].error is None for i in range(20) if i != 3)


def test_engine_that_raises_mid_run_loses_nothing(tmp_path):
    marker = tmp_path / "raised"
    pool, answers, seen = run(specs(2, Fake(raise_after=7, marker=str(marker))), qs(60))
    assert marker.exists()
    assert sorted(seen) == sorted(f"q{i}" for i in range(60))
    assert all(a.error is None for a in answers.values())


def test_engine_that_cannot_start_fails_the_run():
    with pytest.raises(StartupError, match=r"workers cannot start: worker \d died while starting \(exit code 1: "
                                           r"RuntimeError: fake engine refused to load\)"):
        run(specs(2, Fake(fail_load=True)), qs(3))


def test_workers_dying_between_answers_are_restarted_without_limit(tmp_path):
    # Every worker life ends after 4 answers: far more deaths than any per-worker restart budget
    # would allow, but each comes after progress.
    pool, answers, seen = run(specs(2, Fake(exit_every=4)), qs(60))
    assert sorted(seen) == sorted(f"q{i}" for i in range(60))
    assert all(a.error is None for a in answers.values())
    assert sum(w.restarts for w in pool.workers) >= 8


def test_engine_counters_reach_the_coordinator_whole_by_the_last_answer():
    # EngineStats go out at most every 0.5 s, and when a worker runs dry just before the answers
    # that emptied it: the totals are exact when the run ends, without waiting.
    questions = qs(300)
    pool, answers, _ = run(specs(2, Fake(slow=0.002)), questions)
    counters = pool.engine_counters()
    # Every worker that answered sent its counters (on a loaded machine one worker may have
    # answered everything before the other was ready).
    assert {a.worker_id for a in answers.values()} <= set(counters) <= {0, 1}
    for wid, c in counters.items():
        mine = [a for a in answers.values() if a.worker_id == wid]
        assert c.generated_tokens == 3 * len(mine)  # the fake engine's 3 tokens an answer
        assert c.prompt_tokens == sum(a.prompt_tokens for a in mine)
        assert c.steps > 0 and c.busy_slots >= len(mine)
    assert sum(c.prompt_tokens for c in counters.values()) == sum(len(q.tokens) for q in questions)


def test_engine_counters_add_up_over_a_workers_lives():
    pool, answers, _ = run(specs(1, Fake(exit_every=40, slow=0.002)), qs(200))
    w = pool.workers[0]
    assert w.restarts >= 3 and w.earlier is not None and w.live is not None
    total = pool.engine_counters()[0]
    assert total.steps == w.earlier.steps + w.live.steps
    assert total.generated_tokens == w.earlier.generated_tokens + w.live.generated_tokens
    assert total.generated_tokens > w.live.generated_tokens  # the earlier lives count too
    # and in the report: each life's last counters, sent with its last answers, summed
    assert pool.worker_runs()[0].engine["generated_tokens"] == 3 * 200


def threads_run(fake, ask):
    """One worker of 2 llama.cpp threads, asked for `ask` at its first answers: the pool's
    view before and after, and the workers' answers."""
    worker_specs, engine = specs(1, fake)
    engine = replace(engine, n_threads=2)
    acks, views, latest = [], [], []

    def on_answers(answers):
        if not views:
            views.append(pool.llama_threads()[0])
            pool.set_threads(0, ask)
            views.append(pool.llama_threads()[0])
        latest[:] = [pool.llama_threads()[0]]  # the workers are gone once run() returns

    pool = WorkerPool(worker_specs, on_answers=on_answers, on_threads=acks.append)
    pool.run(qs(400), engine)
    return views, acks, latest[0]


def test_set_threads_reaches_the_worker_between_steps_and_its_answer_comes_back():
    views, acks, after = threads_run(Fake(slow=0.002, threads=True), ask=1)
    assert views == [WorkerThreads(2, 2, True), WorkerThreads(2, 2, False)]  # asked: not again until answered
    assert [(a.worker_id, a.before, a.n_threads) for a in acks] == [(0, 2, 1)]
    assert acks[0].steps >= 1  # asked once answers had come: after steps
    assert after == WorkerThreads(1, 2, True)  # the count the worker said, under the one it started with


def test_an_engine_that_cannot_change_its_threads_says_so_and_is_not_asked_again():
    views, acks, after = threads_run(Fake(slow=0.002), ask=1)
    assert [(a.worker_id, a.before, a.n_threads) for a in acks] == [(0, 2, 2)]
    assert after == WorkerThreads(2, 2, False)


def test_a_worker_building_its_engine_can_be_told_its_threads_before_its_first_step(tmp_path):
    # Under contention the first steps (the prompts) are the slowest: a worker still building its
    # engine counts for the thread controller, and runs its first step with the count it was told.
    first = tmp_path / "threads"
    worker_specs, engine = specs(1, Fake(threads=True, build_s=3.0, first_step_threads_to=str(first)))
    engine = replace(engine, n_threads=2)
    views, acks = [], []

    def on_tick(pool):
        if not views:
            views.append(pool.llama_threads()[0])
            pool.set_threads(0, 1)

    pool = WorkerPool(worker_specs, on_answers=lambda answers: None, on_tick=on_tick, on_threads=acks.append)
    assert pool.llama_threads() == {}  # not configured yet: nothing to tell
    answers = pool.run(qs(20), engine)
    assert views == [WorkerThreads(2, 2, True)]  # the configuration's count, before Ready
    assert acks == [ThreadsSet(0, before=2, n_threads=1, steps=0)]  # before its first step
    assert first.read_text() == "1" and len(answers) == 20


def test_a_worker_given_a_device_sees_only_that_gpu(tmp_path, monkeypatch):
    import json

    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "MUSA_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    seen = tmp_path / "env.json"
    worker_specs, engine = specs(1, Fake(environ_to=str(seen)))
    run(([replace(worker_specs[0], device=1)], engine), qs(3))
    assert json.loads(seen.read_text()) == {"CUDA_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1",
                                            "MUSA_VISIBLE_DEVICES": "1", "GGML_VK_VISIBLE_DEVICES": "1"}


@pytest.mark.model
def test_when_no_worker_can_start_any_more_the_answers_so_far_are_written(tmp_path, demo_model):
    # Through run_job: the worker dies at its third answer and can never start again; the run
    # ends, and the answers file has the two it sent and says of the others why not.
    import json

    from ggbatch import build_config, run_job

    q = tmp_path / "q.jsonl"
    write_jsonl(q, [{"questionID": f"q{i}", "question": f"Question {i}?"} for i in range(5)])
    out = tmp_path / "a.json"
    fake = Fake(exit_after=3, marker=str(tmp_path / "died"), fail_load_once_marked=True)
    config = build_config([("t", {"model": demo_model, "input": str(q), "output": str(out), "workers": 1,
                                  "slots": 1})])
    with pytest.raises(WorkerFailure, match="no worker can start any more"):
        run_job(config, engine_factory=fake, progress="log")
    rows = json.loads(out.read_text())
    assert [r["questionID"] for r in rows] == [f"q{i}" for i in range(5)]
    answered = [r for r in rows if r["answer"] is not None]
    assert len(answered) == 2
    assert all(r["error"].startswith("not answered: no worker can start any more") for r in rows
               if r["answer"] is None)


@pytest.mark.timeout(30)
def test_a_wake_ends_the_pools_wait_at_once_and_is_drained():
    import select
    import threading

    from ggbatch.runner.pool.wake import WakePipe

    pipe = WakePipe()
    try:
        waker = threading.Timer(0.2, pipe.wake)
        waker.start()
        t0 = time.monotonic()
        assert LocalBackend().wait([], 20.0, pipe.fd) == []
        assert time.monotonic() - t0 < 10  # woken by the call, not at the end of its 20 s
        assert not select.select([pipe.fd], [], [], 0)[0]  # drained: the next wait blocks again
        for _ in range(100_000):  # a full pipe is no error: it is readable already
            pipe.wake()
    finally:
        pipe.close()


OUT_OF_MEMORY = """
import logging, sys
sys.path.insert(0, sys.argv[1])
from test_pool import Fake, qs, run, specs
logging.basicConfig(format="%(message)s")
try:
    pool, answers, _ = run(specs(1, Fake(memory_on=sys.argv[2])), qs(int(sys.argv[3])))
    print(answers["q0"].error)
except Exception as exc:
    print(exc)
"""
AS_LIMIT = 4 << 30  # room for the coordinator and a worker; no room for what the fake asks


def run_under_a_limit(memory_on, n_questions):
    """The pool in a process of its own under ulimit -v (its workers inherit it): (what it ended
    with, its log lines)."""
    import resource
    import subprocess
    import sys
    from pathlib import Path
    r = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY, str(Path(__file__).parent), memory_on, str(n_questions)],
                       capture_output=True, text=True, timeout=50,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT)))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), [line for line in r.stderr.splitlines() if line.strip()]


LIMIT_WORDS = (f" under the address-space limit of {AS_LIMIT >> 20} MiB per process (ulimit -v): "
               "raise or remove the limit")


def test_workers_out_of_memory_while_answering_under_ulimit_v_name_the_limit():
    # Every question asks for more than the limit allows, as long prompts did of llama.cpp
    # (std::bad_alloc): each death and the giving up say that the limit, not the machine, ran out.
    ended, log = run_under_a_limit("*", 8)
    assert ended.startswith("workers died 4 times in a row with no question answered in between (last: worker 0, ")
    assert ended.endswith(f"MemoryError: ){LIMIT_WORDS}; giving up"), ended
    deaths = [line for line in log if "questions go back to the queue" in line]
    assert len(deaths) == 3 and all(f"){LIMIT_WORDS}; " in line for line in deaths), log


def test_a_question_that_runs_out_of_memory_alone_under_ulimit_v_names_the_limit():
    error, _ = run_under_a_limit("q0", 2)
    assert error.startswith("a worker died 2 times while answering it alone (last: ")
    assert error.endswith(LIMIT_WORDS), error


@pytest.mark.model
def test_a_model_file_replaced_during_the_run_is_not_loaded_again(tmp_path, demo_model):
    """A re-download renamed over the model file, then a worker death: the restarted worker
    loaded the new file and answered the rest of the run with it, silently (exit 0, the journal
    naming the first file). The run now stops with one line saying so, and keeps what it made."""
    import os
    import shutil
    import threading

    from ggbatch import build_config, run_job
    from ggbatch.runner.errors import ModelError
    from ggbatch.runner.model.make.modelgen import make_model
    from helpers import wait_for

    model, started = tmp_path / "model.gguf", tmp_path / "started"
    shutil.copy(demo_model, model)
    other = make_model(tmp_path / "other.gguf", "demo", seed=1, ftype="f32")
    q, out = tmp_path / "q.jsonl", tmp_path / "a.jsonl"
    write_jsonl(q, [{"questionID": f"q{i}", "question": f"Question {i}?"} for i in range(60)])
    # one answer a step, 0.05 s each: the worker dies at its 20th answer, a second after its first step
    fake = Fake(slow=0.05, exit_after=20, marker=str(tmp_path / "died"), started=str(started))
    config = build_config([("t", {"model": str(model), "input": str(q), "output": str(out), "workers": 1,
                                  "slots": 1})])

    def swap() -> None:
        wait_for(started.exists, 30, "the worker's first step")
        os.replace(other, model)

    swapper = threading.Thread(target=swap)
    swapper.start()
    with pytest.raises(ModelError, match="model.gguf: the model file changed while the run went on"):
        run_job(config, engine_factory=fake, progress="log")
    swapper.join()
    assert (tmp_path / "died").exists()
    assert not out.exists()  # exit 2 writes no answers file: the journal keeps what it made
    journaled = (tmp_path / "a.jsonl.journal.jsonl").read_text().count('"qid"')
    assert journaled >= 19  # all it sent before its death: renamed over, its file was not written to


def test_a_larger_context_asked_while_a_worker_builds_its_first_is_built_after_it_and_its_failure_ends_the_run(
        tmp_path):
    # The worker is held short of Ready with the first engine when the pool is told to grow. Its
    # Ready then answers the first engine, not the larger one: that the larger context cannot be
    # made must end the run as a model error (every worker would fail the same way), not count
    # as a death to be started again.
    gate = tmp_path / "gate"
    worker_specs, engine = specs(1, Fake(build_gate=str(gate), max_context=64))
    larger = replace(engine, n_ctx_seq=128)

    def grow_then_open(pool):
        if not gate.exists():
            assert pool.workers[0].ready is None  # still building the first engine
            pool.reconfigure({0: larger})
            gate.touch()

    pool = WorkerPool(worker_specs, on_tick=grow_then_open)
    with pytest.raises(ModelError, match="not enough memory"):
        pool.run(qs(20), engine)
    assert pool.workers[0].restarts == 0
