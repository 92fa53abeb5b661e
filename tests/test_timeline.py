"""The run's timeline (pure): rates from counters, bounded length, totals kept through thinning,
the last sample of a stopped run."""

from ggbatch.runner.watch.timeline import MIB, Sample, Timeline, WorkerPoint
from ggbatch.runner.watch.watch import RunWatch
from ggbatch.workers.protocol import EngineStats
from helpers import answer as make_answer


def point(generated, prompt=0, steps=0, busy=0, cpu=0.0, pss=100 * MIB, threads=3):
    return WorkerPoint(generated, prompt, steps, busy, cpu, pss, threads)


def test_rates_and_means_are_differences_of_counters():
    t = Timeline(every_s=2.0)
    t.add(Sample(1.0, 0, 0))  # the run starts
    t.add(Sample(3.0, 0, 0, {0: point(200, 1000, 10, 320, cpu=4.0)}))
    t.add(Sample(5.0, 4, 1, {0: point(600, 1000, 30, 960, cpu=8.0), 1: point(50, cpu=1.0)}))
    rows = t.as_report()
    assert [r["t_s"] for r in rows] == [1.0, 3.0, 5.0]
    first = rows[1]["workers"]["0"]
    assert first["generated_per_s"] == 100.0 and first["prompt_per_s"] == 500.0
    assert first["busy_slots"] == 32.0
    assert first["cpu_percent"] is None  # its CPU time before the run is not this interval's
    w0, w1 = rows[2]["workers"]["0"], rows[2]["workers"]["1"]
    assert (w0["generated_per_s"], w0["busy_slots"], w0["cpu_percent"]) == (200.0, 32.0, 200.0)
    assert w0["pss_mib"] == 100.0 and w0["threads"] == 3
    assert w1["busy_slots"] is None  # no step ended in the interval
    assert rows[2]["generated_tokens"] == 650 and rows[2]["done"] == 4 and rows[2]["failed"] == 1
    assert rows[2]["generated_per_s"] == 200.0 + 25.0


def test_a_long_run_is_thinned_to_a_bounded_length_and_keeps_its_totals():
    t = Timeline(every_s=2.0, max_samples=50)
    for i in range(2000):  # ticks of a 4000 s run, 10 tokens a second; the last one always taken
        time_s = 2.0 * i
        if t.due(time_s) or i == 1999:
            t.add(Sample(time_s, i, 0, {0: point(20 * i, steps=i, busy=8 * i)}))
    rows = t.as_report()
    assert len(rows) <= 50 and t.every_s > 2.0
    assert rows[-1]["t_s"] == 2.0 * 1999 and rows[-1]["generated_tokens"] == 20 * 1999  # the end stays
    later = rows[1:]
    assert all(r["workers"]["0"]["generated_per_s"] == 10.0 and r["workers"]["0"]["busy_slots"] == 8.0
               for r in later)
    assert [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)


class _StoppedPool:
    """What RunWatch reads of a pool a stop ended: not finished, its engines' counters as last
    sent (0.5 s behind the answers)."""

    finished = False

    def engine_counters(self):
        return {0: EngineStats(0, steps=3, busy_slots=3, generated_tokens=2, prompt_tokens=40)}

    def llama_threads(self):
        return {}


def test_a_stopped_run_ends_its_timeline_with_a_sample_holding_its_answers_tokens():
    """A stopped run's timeline ended at its last 2-second sample (40 of 96 questions), and a
    sample could say 128 generated tokens for 64 answers of 16."""
    watch = RunWatch("off", adapt_threads=False)
    watch.start_run(2, 16, 1)
    watch.on_answers([make_answer("a", tokens=16), make_answer("b", tokens=16)])
    watch.end(_StoppedPool())
    last = watch.timeline.as_report()[-1]
    assert len(watch.timeline.samples) == 2 and last["done"] == 2
    assert last["generated_tokens"] == 32 and last["prompt_tokens"] == 40
