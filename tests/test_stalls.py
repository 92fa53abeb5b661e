"""Saying so when a worker stops making progress, and the low-memory pause's words."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import ROOT
from ggbatch.runner.watch.memory_guard import LowMemoryPause
from ggbatch.runner.watch.stalls import StallWatch
from helpers import ggbatch_command, journal_entries, wait_for


def test_a_worker_whose_cpu_time_stops_growing_is_a_stall_once_then_recovers():
    watch = StallWatch(stall_s=10)
    said = [watch.sample(0, cpu, 8, state, t, 4) for t, cpu, state in
            [(0, 1.0, "running"), (1, 2.0, "running"), (2, 2.0, "stopped"), (8, 2.0, "stopped"),
             (12, 2.01, "stopped"), (13, 2.02, "stopped"), (14, 3.0, "running")]]
    assert said[:4] == [None] * 4
    # 8 held by a worker of 4 slots: 4 decode, 4 wait at the worker ("8 questions in flight" read as 8 decoding)
    assert said[4] == ("worker 0 has made no progress for 11 s with 8 questions held (4 decoding) "
                       "(process state: stopped: SIGSTOP or a debugger? SIGCONT resumes it)")
    assert said[5] is None  # said once
    assert said[6] == "worker 0 is making progress again"
    assert watch.stalls == 1


def test_an_idle_worker_or_a_restarted_one_is_no_stall():
    watch = StallWatch(stall_s=10)
    assert all(watch.sample(1, 5.0, 0, "sleeping", t) is None for t in range(0, 30, 5))  # holds nothing
    assert watch.sample(1, 0.1, 4, "running", 31) is None  # CPU time went back: a new process
    assert watch.sample(1, 0.1, 4, "running", 40) is None
    assert watch.sample(1, 0.1, 4, "sleeping", 41.5).startswith("worker 1 has made no progress for 10 s "
                                                                "with 4 questions held (process state")


class Pool:
    """The admission interface the pause drives (WorkerPool's)."""

    def __init__(self) -> None:
        self.paused = self.stopping = False

    def pause(self, paused: bool) -> None:
        self.paused = paused


def test_low_memory_pauses_and_resumes_but_says_nothing_once_stopping(caplog):
    pause, pool = LowMemoryPause(total_memory=1000 << 20), Pool()
    with caplog.at_level("WARNING", logger="ggbatch"):
        pause.update(40 << 20, pool)
        assert pool.paused
        pool.stopping = True
        pause.update(500 << 20, pool)
    assert pool.paused  # a stopping pool stays paused, and the log does not claim otherwise
    assert [r.getMessage() for r in caplog.records] == [
        "only 40 MiB available: admitting no new questions until memory recovers"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stopped_worker_is_reported_within_seconds_and_the_job_still_finishes(tmp_path, demo_model, questions_file):
    import psutil

    out = tmp_path / "a.json"
    command = ggbatch_command("run", "--model", demo_model, "--input", questions_file(32), "--output", out,
                              "--max-tokens", 64, "--workers", 1, "--slots", 2, "--progress", "log")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_entries(out) >= 2, 60, "two journaled answers")
    (worker,) = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    os.kill(worker.pid, signal.SIGSTOP)
    stderr = _finished_after_a_stall(proc, worker.pid)
    assert "worker 0 is making progress again" in stderr
    held, decoding = map(int, re.search(r"with (\d+) questions held \((\d+) decoding\)", stderr).groups())
    assert decoding == min(held, 2)  # its 2 slots decode, the rest wait at the worker
    assert len(json.loads(out.read_text())) == 32


def _finished_after_a_stall(proc: subprocess.Popen, stopped_worker: int) -> str:
    """The run's stderr, once the worker stopped long enough to be reported is let go on and the
    run has ended well, having said so."""
    time.sleep(12.5)
    os.kill(stopped_worker, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr
    assert "worker 0 has made no progress for 1" in stderr and "process state: stopped" in stderr
    return stderr


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_worker_stopped_in_the_middle_of_a_long_message_holds_up_only_itself(tmp_path, demo_model,
                                                                             questions_file):
    """Top-20 token log-probabilities of 8 answers of 256 tokens: a message longer than the pipe's
    buffer. Stopped in the middle of writing it, the worker is reported as stalled: the coordinator
    goes on ticking, where a blocking read of the message froze it."""
    import psutil

    out = tmp_path / "a.json"
    command = ggbatch_command("run", "--model", demo_model, "--input", questions_file(16), "--output", out,
                              "--max-tokens", 256, "--ignore-eos", "--token-logprobs", 20, "--workers", 1,
                              "--slots", 8, "--progress", "log")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_entries(out) >= 8, 90, "the first batch answered")
    children = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    worker = max(children, key=lambda c: c.cpu_times().user)  # not the tokenizer process
    os.kill(proc.pid, signal.SIGSTOP)  # nobody reads: the worker's next answers fill the pipe
    try:
        wait_for(lambda: _state(worker.pid) == "S", 60, "the worker waiting to write", every=0.05)
        os.kill(worker.pid, signal.SIGSTOP)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _finished_after_a_stall(proc, worker.pid)
    assert len(json.loads(out.read_text())) == 16
