"""Threads under contention across real processes: llama.cpp takes the count it is given on a
live context, a real worker changes it between steps, and a run beside a busy loop gives a thread
up and says when and why (the controller's decisions themselves: tests/test_threads.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from array import array
from contextlib import contextmanager

import numpy as np
import psutil
import pytest

from conftest import ROOT, two_cores
from ggbatch.runner.pool.pool import WorkerPool
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question, ThreadsSet
from ggbatch.workers.spec import WorkerSpec
from helpers import ggbatch_command, wait_for

pytestmark = [pytest.mark.timeout(150), pytest.mark.model]


@contextmanager
def busy_loop():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_llama_cpp_takes_a_new_thread_count_on_a_live_context(demo_model):
    import llama_cpp

    from ggbatch.workers.llama.model_runner import ModelRunner

    runner = ModelRunner(demo_model, n_threads=2, n_ctx=64, n_seq_max=1, n_batch=16, kv_unified=True)
    try:
        assert runner.n_threads == 2
        assert runner.set_threads(1) == 1 == llama_cpp.llama_n_threads(runner.ctx)
        assert llama_cpp.llama_n_threads_batch(runner.ctx) == 1
        n = 8
        assert runner.decode(np.arange(1, n + 1, dtype=np.int32), np.arange(n, dtype=np.int32),
                             np.zeros(n, np.int32), np.ones(n, np.int8)) == 0
        assert runner.set_threads(2) == 2 == runner.n_threads
    finally:
        runner.close()


def logits_at(runner, threads):
    """Every logit row of 4 prompts of 24 tokens, then of 8 decode steps (odd ones a batch of one:
    the single-query attention path), all run with `threads` llama.cpp threads."""
    import llama_cpp

    runner.set_threads(threads)
    for s in range(4):
        runner.seq_rm(s)
    n, vocab, rows = 24, runner.vocab.n_tokens, []
    tokens = (np.arange(4 * n, dtype=np.int32) * 37) % 500 + 3
    assert runner.decode(tokens, np.tile(np.arange(n, dtype=np.int32), 4),
                         np.repeat(np.arange(4, dtype=np.int32), n), np.ones(4 * n, np.int8)) == 0
    rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits(runner.ctx), shape=(4 * n, vocab)).copy())
    pos = [n] * 4
    for step in range(8):
        k = 1 if step % 2 else 4
        assert runner.decode(np.full(k, 7 + step, np.int32), np.array(pos[:k], np.int32),
                             np.arange(k, dtype=np.int32), np.ones(k, np.int8)) == 0
        pos[:k] = [p + 1 for p in pos[:k]]
        rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits(runner.ctx), shape=(k, vocab)).copy())
    return rows


@pytest.mark.parametrize("flash_attn,kv_unified,repack", [(True, True, True), (True, False, True),
                                                         (False, False, False)])
def test_the_thread_count_changes_no_logit(demo_model, flash_attn, kv_unified, repack):
    # ggml splits each operation's output rows among the threads, never a sum: an answer does not
    # depend on how many threads contention left the worker (batch_invariant's layout included:
    # flash attention, kv_unified and repacking off).
    from ggbatch.workers.llama.model_runner import ModelRunner

    runner = ModelRunner(demo_model, n_threads=2, n_ctx=256, n_seq_max=4, n_batch=128, kv_unified=kv_unified,
                         flash_attn=flash_attn, repack=repack)
    try:
        two, one = logits_at(runner, 2), logits_at(runner, 1)
    finally:
        runner.close()
    assert all(np.array_equal(a, b) for a, b in zip(two, one))


def test_a_real_worker_runs_the_thread_count_it_is_told(demo_model):
    engine = EngineConfig(model_path=demo_model, n_threads=2, slots=4, n_ctx_seq=96, n_batch=64,
                          generation=GenerationParams(max_tokens=48, ignore_eos=True))
    questions = [Question(f"q{i}", array("i", [1, 50 + i, 300, 20 + i]), i) for i in range(40)]
    acks: list[ThreadsSet] = []

    def on_answers(answers):
        if not acks and pool.llama_threads()[0].settable:
            pool.set_threads(0, 1)

    pool = WorkerPool([WorkerSpec(0, two_cores(), demo_model, repack=False)], on_answers=on_answers,
                      on_threads=acks.append)
    answers = pool.run(questions, engine)
    # llama_n_threads, read back in the worker, after the steps that made the first answers
    assert [(a.worker_id, a.before, a.n_threads) for a in acks] == [(0, 2, 1)] and acks[0].steps >= 1
    assert pool.workers[0].threads.n_threads == 1  # what the pool holds of it (its link is gone after run())
    assert len(answers) == 40 and all(a.error is None and a.completion_tokens == 48 for a in answers.values())


def test_a_run_beside_a_busy_loop_gives_a_thread_up_and_says_why(tmp_path, demo_model, questions_file):
    two_cores()
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    # long enough (several seconds) for the controller to gather its evidence on a fast machine
    cmd = ggbatch_command("run", "--model", demo_model, "--input", questions_file(128), "--output", out,
                          "--report", report, "--max-tokens", 128, "--ignore-eos", "--progress", "log")
    with busy_loop() as loop:
        wait_for(lambda: sum(psutil.Process(loop.pid).cpu_times()[:2]) >= 0.3, 30, "the busy loop burning a core")
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    threads = json.loads(report.read_text())["threads"]
    assert threads["adapt"] == "auto"
    first = threads["changes"][0]
    assert (first["worker"], first["from"], first["to"]) == (0, 2, 1), threads
    assert re.fullmatch(r"about \d\.\d cores? of other load on its 2 cores for \d s( \(.* CPU steal\))?",
                        first["reason"]), first
    assert f"ggbatch: worker 0: 2 → 1 llama.cpp threads: {first['reason']}" in done.stderr
    assert f"threads    worker 0: 2 → 1 at {first['t_s']:.0f} s" in done.stdout  # the summary
    timeline = json.loads(report.read_text())["timeline"]
    assert {s["workers"]["0"]["llama_threads"] for s in timeline if "0" in s["workers"]} >= {1}
