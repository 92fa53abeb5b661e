"""What the coordinator keeps while it watches a run does not grow with the run's length: a warm
pool kept open for days samples the machine every second and times every answer."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc

import psutil
import pytest

from ggbatch.runner.report.report import percentiles
from ggbatch.runner.watch.monitor import Monitor
from ggbatch.runner.watch.reservoir import Reservoir
from ggbatch.runner.watch.tally import AnswerTally
from helpers import answer


@pytest.mark.timeout(120)
def test_the_monitor_keeps_the_same_memory_however_many_samples_it_takes():
    monitor = Monitor()
    sums: list[float] = []  # each core's busy % as the test adds it up itself: no float of the monitor's kept
    def sample() -> None:
        monitor.sample({})
        for i, core in enumerate(monitor.cores):
            if i == len(sums):
                sums.append(0.0)
            sums[i] += core.percent
    for _ in range(50):  # warm: psutil's own first-call caches
        sample()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(3000):
        sample()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename")
                if s.traceback[0].filename.endswith("monitor.py"))
    tracemalloc.stop()
    # a row a sample, as it kept before, is at least 72 B: 216 KB over 3000 samples on any machine
    assert grown < 32 * 1024, f"{grown} bytes kept by the monitor over 3000 samples"
    assert monitor.summary().mean_core_utilisation_percent == [round(total / 3050, 1) for total in sums]


def test_a_reservoir_keeps_its_size_a_uniform_sample_and_the_exact_max():
    kept = Reservoir(kept=1000)
    for i in range(100_000):
        kept.append(float((i * 7919) % 100_000))  # every value 0..99999 once, not in order
    assert len(kept) == 1000 and kept.seen == 100_000 and kept.most == 99_999.0
    got = percentiles(kept, kept.most)
    assert 40_000 <= got["p50"] <= 60_000 and 90_000 <= got["p95"] <= 99_999 and got["max"] == 99_999


def test_a_tally_keeps_a_bounded_sample_of_the_latencies_and_exact_ones_below_it():
    tally = AnswerTally(kept=100)
    tally.add([answer(f"q{i}", latency_s=float(i)) for i in range(5000)])
    assert tally.made == 5000 and len(tally.latency_s) == len(tally.ttft_s) == 100
    assert percentiles(tally.latency_s, tally.latency_s.most)["max"] == 4999.0
    small = AnswerTally(kept=100)
    small.add([answer(f"q{i}", latency_s=float(i)) for i in range(1, 21)])
    assert percentiles(small.latency_s, small.latency_s.most) == {"p50": 10.0, "p95": 19.0, "max": 20.0}


@pytest.mark.timeout(60)
def test_a_workers_mean_cpu_covers_all_its_lives_as_its_questions_do():
    """After a restart the summary's % CPU was the last life's alone: an idle last life read 0 %
    for a worker that had been busy all run."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(60)"
    monitor = Monitor()
    busy = subprocess.Popen([sys.executable, "-c", spin])
    idle = None
    try:
        deadline = time.monotonic() + 30
        while sum(psutil.Process(busy.pid).cpu_times()[:2]) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        monitor.sample({0: busy.pid})
        first = monitor.workers[0].cpu_s
        busy.kill()
        idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(1.5)
        monitor.sample({0: idle.pid})
        assert set(monitor._procs) == {idle.pid}  # a dead life's handle let go: bounded over restarts
        assert monitor.workers[0].threads >= 1
        monitor.sample({})  # between lives: the timeline's gauges say nothing held, not the last life's
        assert (monitor.workers[0].pss, monitor.workers[0].threads) == (0, 0)
    finally:
        for proc in (busy, idle):
            if proc is not None:
                proc.kill()
                proc.wait()
    usage = monitor.workers[0]
    assert first >= 0.6 and usage.total_cpu_s >= first
    lives_alive = usage.earlier_alive_s + usage.alive_s
    assert usage.mean_cpu == pytest.approx(100 * usage.total_cpu_s / lives_alive)
    assert usage.mean_cpu > 2 * (100 * usage.cpu_s / usage.alive_s) and usage.mean_cpu > 10


def test_a_worker_the_monitor_could_not_see_is_not_said_to_use_no_cpu_or_memory():
    """A Ray worker on another node: psutil sees only this machine's processes, and the summary
    read '0% CPU, peak PSS 0 MiB' for a worker busy all run."""
    from ggbatch.runner.report.report import _usage_summary

    node = {"ip": "10.0.0.7", "node_id": "ab" * 28}
    unseen = "CPU and memory not measured (the monitor sees this machine's processes only)"
    assert _usage_summary({"node": node}) == unseen
    assert _usage_summary({}) == "CPU and memory not measured"
    seen = {"node": node, "mean_cpu_percent": 97.4, "peak_pss_mib": 211.6}
    assert _usage_summary(seen) == "97% CPU, peak PSS 212 MiB"
