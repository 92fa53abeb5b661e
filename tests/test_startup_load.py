"""The thread controller's first evidence, across real processes: ggbatch's own CPU time (its
children alive and ended) is told apart from other load, and a worker that loads beside a busy
loop is told its thread count at Ready, so that its first step already runs it
(runner/watch/startup_load.py; the decisions themselves: tests/test_threads.py)."""

from __future__ import annotations

import subprocess
import sys
from array import array

import psutil
import pytest

from conftest import two_cores
from fake_engine import Fake
from ggbatch.runner.pool.pool import WorkerPool
from ggbatch.runner.watch.startup_load import ggbatch_cpu_s, process_cpu_s
from ggbatch.runner.watch.watch import RunWatch
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question, ThreadsSet
from ggbatch.workers.spec import WorkerSpec
from helpers import wait_for

pytestmark = pytest.mark.timeout(60)

# Burns `seconds` of its own CPU time, then says so and sleeps until killed.
BURN = ("import sys, time\n"
        "while time.process_time() < float(sys.argv[1]): pass\n"
        "print('done', flush=True)\n"
        "time.sleep(60)\n")


def burner(seconds: float, stay: bool) -> subprocess.Popen:
    code = BURN if stay else BURN.replace("time.sleep(60)\n", "")
    return subprocess.Popen([sys.executable, "-c", code, str(seconds)], stdout=subprocess.PIPE, text=True)


def test_ggbatch_cpu_counts_its_children_alive_and_ended():
    before = ggbatch_cpu_s()
    ended, alive = burner(0.5, stay=False), burner(0.5, stay=True)
    try:
        assert ended.stdout.readline() == "done\n" and alive.stdout.readline() == "done\n"
        ended.wait(timeout=30)  # waited for: its CPU time is now in this process's children's
        alive_cpu = process_cpu_s(alive.pid)
        grown = ggbatch_cpu_s() - before
    finally:
        alive.kill()
        alive.wait()
    # (CPU times come in clock ticks of 10 ms)
    assert alive_cpu is not None and alive_cpu >= 0.45
    assert grown >= alive_cpu + 0.45  # the ended one's too, from the wait
    assert process_cpu_s(alive.pid) is None  # gone


def outside_loop() -> psutil.Process:
    """A busy loop that is not this process's descendant (a shell starts it and exits, so it is
    handed to init): other load, as another user's job is."""
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True, timeout=10)
    loop = psutil.Process(int(shell.stdout))
    assert loop.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    return loop


def load_beside_a_busy_loop(tmp_path, adapt: bool):
    """A one-worker pool on two cores whose fake engine takes 2.5 s to build (sleeping, as a
    worker waits for its model's pages) while a busy loop runs. Returns (the RunWatch, the
    ThreadsSet answers, the thread count of the worker's first step)."""
    first = tmp_path / "threads"
    fake = Fake(threads=True, build_s=2.5, first_step_threads_to=str(first))
    engine = EngineConfig(model_path="fake.gguf", n_threads=2, slots=4, n_ctx_seq=64, n_batch=64,
                          generation=GenerationParams())
    questions = [Question(f"q{i}", array("i", range(i % 7 + 1)), i) for i in range(20)]
    loop = outside_loop()
    try:
        wait_for(lambda: sum(loop.cpu_times()[:2]) >= 0.3, 30, "the busy loop burning a core")
        watch = RunWatch("off", adapt_threads=adapt)
        acks: list[ThreadsSet] = []

        def on_threads(msg: ThreadsSet) -> None:
            acks.append(msg)
            watch.on_threads(msg)

        # No on_tick: only the load since the start feeds the controller.
        pool = WorkerPool([WorkerSpec(0, two_cores(), "fake.gguf", engine_factory=fake)],
                          on_answers=lambda answers: None, on_threads=on_threads, on_ready=watch.on_ready)
        assert len(pool.run(questions, engine)) == 20
    finally:
        loop.kill()
    return watch, acks, int(first.read_text())


def test_a_worker_loading_beside_a_busy_loop_runs_its_first_step_at_one_thread(tmp_path):
    # Its two cores carry about a core of other load for the 3 s it takes to be Ready: evidence
    # enough, decided at Ready.
    watch, acks, first_step_threads = load_beside_a_busy_loop(tmp_path, adapt=True)
    assert acks == [ThreadsSet(0, before=2, n_threads=1, steps=0)]
    assert first_step_threads == 1
    (change,) = watch.thread_changes
    assert change["after_steps"] == 0 and change["from"] == 2 and change["to"] == 1
    assert change["reason"].startswith("about ") and "of other load on its 2 cores for " in change["reason"]


def test_threads_adapt_off_leaves_the_worker_its_count(tmp_path):
    watch, acks, first_step_threads = load_beside_a_busy_loop(tmp_path, adapt=False)
    assert acks == [] and watch.thread_changes == [] and first_step_threads == 2
