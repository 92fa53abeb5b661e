"""The thread controller's decisions (pure): contention arriving, lasting and leaving, a quiet
machine, noise; on made-up samples and on samples recorded on this 2-core machine
(tests/data/threads/, bench/record_cpu_samples.py)."""

from __future__ import annotations

import json
import random
from collections import namedtuple
from pathlib import Path

import pytest

from ggbatch.runner.watch.monitor import CoreTime, core_times
from ggbatch.runner.watch.thread_controller import CoreLoad, ThreadChange, ThreadController, core_load

RECORDED = Path(__file__).parent / "data" / "threads"


def load(other, cores=2, own=1.0, interval=1.0, steal=0.0):
    """One interval of a worker's cores with `other` cores' worth of other load on them."""
    return CoreLoad(interval, cores, (own + other) * interval, steal * interval, own * interval)


def replay(loads, threads=2, ceiling=2, start=0.0, follow=True):
    """Feed one sample per interval; with `follow`, the worker runs what was decided. Returns
    [(time, change)]."""
    c, now, out = ThreadController(), start, []
    for sample in loads:
        now += sample.interval_s
        change = c.sample(0, now, sample, threads, ceiling)
        if change is not None:
            out.append((round(now, 2), change))
            threads = change.to if follow else threads
    return out


def test_a_busy_loop_beside_two_threads_gives_one_up_after_two_seconds():
    # Measured here: 2 threads beside `while True: pass` on 2 cores, 0.66-0.68 cores of other load.
    changes = replay([load(0.02)] * 5 + [load(0.67)] * 5)
    assert changes == [(7.0, ThreadChange(0, 2, 1, "about 0.7 cores of other load on its 2 cores for 2 s"))]


def test_one_second_of_contention_is_not_enough():
    assert replay([load(0.02), load(0.9), load(0.02)] * 20) == []


def test_the_cores_free_again_take_the_thread_back_after_five_seconds():
    # At 1 thread beside the loop, the loop has a core to itself: 1.0 of other load.
    changes = replay([load(1.0)] * 10 + [load(0.03)] * 10, threads=1)
    assert changes == [(15.0, ThreadChange(0, 1, 2, "its cores have been free for 5 s (other load about "
                                                    "0.0 core)"))]


def test_contention_arriving_lasting_and_leaving():
    # 2 threads; a loop arrives at 10 s (0.67 while the worker keeps 2 threads, then 1.0 at 1
    # thread), leaves at 40 s.
    samples, threads, now, c, seen = [], 2, 0.0, ThreadController(), []
    for t in range(60):
        other = 0.02 if t < 10 or t >= 40 else 0.67 if threads == 2 else 1.0
        now += 1.0
        change = c.sample(0, now, load(other), threads, 2)
        if change:
            seen.append((now, change.threads, change.to))
            threads = change.to
        samples.append(threads)
    assert seen == [(12.0, 2, 1), (45.0, 1, 2)]


def test_a_quiet_machine_never_changes_anything():
    rng = random.Random(7)
    # The coordinator, the monitor and the system take a few hundredths of a core, and now and
    # then something wakes for a second (up to a whole core), whatever the worker is doing.
    quiet, spike = [], False
    for _ in range(3600):
        spike = not spike and rng.random() < 0.05
        quiet.append(load(rng.uniform(0.3, 1.0) if spike else rng.uniform(0.0, 0.12), own=rng.uniform(0.2, 2.0),
                          interval=rng.uniform(0.9, 1.1)))
    assert replay(quiet) == []


def test_noise_around_a_threshold_does_not_flap():
    rng = random.Random(3)
    # Other load hovering between the raise and the lower thresholds: nothing moves either way.
    assert replay([load(rng.uniform(0.26, 0.39)) for _ in range(600)]) == []
    assert replay([load(rng.uniform(0.26, 0.39)) for _ in range(600)], threads=1) == []
    # Bursts of one second on, one off: never two seconds of contention in a row.
    assert replay([load(0.67), load(0.05)] * 300) == []
    # Long bursts are followed, but no faster than the waits allow: 20 s on, 20 s off.
    changes = replay(([load(0.67)] * 20 + [load(0.03)] * 20) * 3, follow=True)
    assert [(c.threads, c.to) for _, c in changes] == [(2, 1), (1, 2)] * 3
    assert all(b - a >= 2.0 for (a, _), (b, _) in zip(changes, changes[1:]))


def test_never_below_one_nor_above_the_layouts_threads():
    # Two busy loops beside one thread: 1.33 cores of other load, nowhere lower to go.
    assert replay([load(1.33)] * 30, threads=1) == []
    # Quiet, at the layout's count already.
    assert replay([load(0.0)] * 30, threads=2, ceiling=2) == []
    # A worker started with one thread (a GPU layout) is never given more.
    assert replay([load(0.0)] * 30, threads=1, ceiling=1) == []


def test_eight_cores_and_two_busy_loops_give_up_two_threads_not_more():
    # 10 runnable threads on 8 cores: the loops get 1.6 cores while the worker runs 8, 2.0 at 6.
    threads, now, c, seen = 8, 0.0, ThreadController(), []
    for _ in range(30):
        now += 1.0
        other = {8: 1.6, 7: 1.8}.get(threads, 2.0)
        change = c.sample(0, now, load(other, cores=8, own=threads * 0.9), threads, 8)
        if change:
            seen.append((change.threads, change.to))
            threads = change.to
    assert seen == [(8, 6)]


def test_steal_is_other_load_and_the_reason_says_so():
    changes = replay([load(0.8, steal=0.5)] * 3)
    assert changes[0][1].reason == ("about 0.8 cores of other load on its 2 cores for 2 s (0.5 of it CPU "
                                    "steal)")


def test_a_restarted_worker_starts_its_evidence_afresh():
    c = ThreadController()
    assert c.sample(0, 1.0, load(0.9), 2, 2) is None
    assert c.sample(0, 2.0, load(0.9), 1, 2) is None  # another count: the worker was restarted
    assert c.sample(0, 3.0, load(0.9), 2, 2) is None  # and again: one second of evidence only
    assert c.sample(0, 4.0, load(0.9), 2, 2) is not None


def test_a_short_final_interval_says_nothing():
    c = ThreadController()
    assert c.sample(0, 1.0, load(0.9), 2, 2) is None
    assert c.sample(0, 1.1, load(0.9, interval=0.1), 2, 2) is None
    assert c.sample(0, 2.1, load(0.9), 2, 2) is not None


# -- the first evidence: from the job's start to a worker's Ready (runner/watch/startup_load.py) ---------


def test_a_worker_ready_after_two_busy_seconds_is_told_at_once():
    # Loaded beside a busy loop for 2.4 s: decided at Ready, before the worker's first step.
    c = ThreadController()
    change = c.sample(0, 2.4, load(0.9, interval=2.4), 2, 2, at_ready=True)
    assert change == ThreadChange(0, 2, 1, "about 0.9 cores of other load on its 2 cores for 2 s")


def test_the_interval_since_the_start_takes_over_the_ticks_it_spans():
    # A tick at 1.7 s (from the run's start at 0.7 s) began the evidence; the interval from the
    # job's start to Ready at 2.4 s holds it, and lasts long enough on its own. Its mean is the
    # reason's, not a sum of the two.
    c = ThreadController()
    assert c.sample(0, 1.7, load(1.0), 2, 2) is None
    change = c.sample(0, 2.4, load(0.8, interval=2.4), 2, 2, at_ready=True)
    assert change == ThreadChange(0, 2, 1, "about 0.8 cores of other load on its 2 cores for 2 s")


def test_at_ready_one_second_since_the_start_is_enough():
    # A model whose pages are cached loads in about 1.3 s: waiting for 2 s of evidence would let
    # the first step, the prompts, start at the layout's count.
    c = ThreadController()
    assert c.sample(0, 1.3, load(0.9, interval=1.3), 2, 2, at_ready=True) == ThreadChange(
        0, 2, 1, "about 0.9 cores of other load on its 2 cores for 1 s")
    assert ThreadController().sample(0, 1.3, load(0.9, interval=1.3), 2, 2) is None  # a tick's needs 2 s
    # Shorter than a second (a tiny model): the ticks go on with it, as with any evidence.
    c = ThreadController()
    assert c.sample(0, 0.6, load(0.9, interval=0.6), 2, 2, at_ready=True) is None
    assert c.sample(0, 1.6, load(0.7), 2, 2) is None
    assert c.sample(0, 2.6, load(0.7), 2, 2) == ThreadChange(
        0, 2, 1, "about 0.7 cores of other load on its 2 cores for 3 s")


def test_at_ready_a_thread_is_never_taken_back_sooner():
    c = ThreadController()
    assert c.sample(0, 1.5, load(0.0, interval=1.5), 1, 2, at_ready=True) is None


def test_a_quiet_start_changes_nothing():
    c = ThreadController()
    assert c.sample(0, 3.0, load(0.05, own=0.6, interval=3.0), 2, 2, at_ready=True) is None
    assert replay([load(0.05, interval=3.0)] + [load(0.02)] * 20) == []


def test_the_coordinators_cpu_counts_as_its_share_of_the_workers_cores():
    from ggbatch.runner.watch.startup_load import own_share

    assert own_share(1.5, 0.8, (0, 1), coordinator_cores=2) == pytest.approx(2.3)  # every core is the worker's
    assert own_share(1.5, 0.8, (2, 3), coordinator_cores=8) == pytest.approx(1.7)  # a quarter of them
    assert own_share(1.5, -0.1, (0, 1), coordinator_cores=2) == 1.5  # readings a moment apart: never negative
    assert own_share(1.5, 0.8, (0, 1, 2), coordinator_cores=2) == pytest.approx(2.3)  # never more than all of it


def test_core_load_sums_the_workers_own_cores():
    cores = [CoreTime(1.0, 1.0, 0.0), CoreTime(1.0, 0.5, 0.1), CoreTime(1.0, 1.0, 0.0), CoreTime(1.0, 0.2, 0.0)]
    got = core_load(cores, (1, 3), own_s=0.5)
    assert got == CoreLoad(1.0, 2, 0.7, 0.1, 0.5)
    assert round(got.other, 6) == 0.2 and got.steal == 0.1
    assert core_load(cores, (1, 3), own_s=None) is None  # a worker's first sample: no interval yet
    assert core_load(cores, (1, 9), own_s=0.5) is None  # a core psutil did not list
    assert load(0.0, own=1.5).other == 0.0  # never negative (the two readings are a moment apart)


def test_core_times_count_as_psutils_cpu_percent():
    T = namedtuple("scputimes", "user nice system idle iowait irq softirq steal guest guest_nice")
    before = [T(100, 10, 20, 500, 5, 0, 1, 2, 30, 0)]
    after = [T(100.6, 10, 20.2, 500.1, 5.05, 0, 0.01 + 1, 2.04, 30.5, 0)]  # guest time is inside user
    (core,) = core_times(before, after)
    assert core.total_s == pytest.approx(1.0)
    assert core.busy_s == pytest.approx(0.85) and core.steal_s == pytest.approx(0.04)
    assert core.percent == pytest.approx(85.0)


# -- recorded on this machine (bench/record_cpu_samples.py) -----------------------------------------


def recorded(name):
    data = json.loads((RECORDED / name).read_text())
    samples = [s for s in data["samples"] if s["worker"] == 0]
    return data, samples


def as_load(s):
    i = s["interval_s"]
    return CoreLoad(i, s["cores"], s["busy"] * i, s["steal"] * i, s["own"] * i)


def replay_recorded(samples):
    """The controller fed each recorded sample as the live run fed it: [(sample index, change)].
    After a change is asked, the live coordinator feeds nothing more until the worker answers
    (beside busy loops one engine step can take seconds), so neither does the replay."""
    c, now, out, asked = ThreadController(), 0.0, [], None
    for i, s in enumerate(samples):
        at_ready = s.get("at_ready", False)
        # A worker's interval from the job's start to its Ready spans the ticks before it: it
        # ends between two ticks, not one interval after the last.
        now += 0.01 if at_ready else s["interval_s"]
        if asked is not None and s["threads"] != asked:
            continue
        asked = None
        change = c.sample(0, now, as_load(s), s["threads"], 2, at_ready)
        if change is not None:
            out.append((i, change))
            asked = change.to
    return out


RECORDINGS = sorted(p.name for p in RECORDED.glob("*.json"))


def arrival(samples, start=0, above=0.5):
    """The first sample from `start` on with more than `above` cores of other load."""
    return next(i for i, s in enumerate(samples) if i >= start and s["other"] > above)


def departure(samples, start, below=0.25):
    return next(i for i, s in enumerate(samples) if i >= start and s["other"] < below)


@pytest.mark.parametrize("name", RECORDINGS)
def test_replaying_a_recording_makes_the_live_runs_decisions(name):
    # The controller is a pure function of what it is fed: fed the recorded samples, it decides
    # what the coordinator decided in the recorded run, with the same reasons; and the worker
    # ran each count it was given.
    data, samples = recorded(name)
    replayed = replay_recorded(samples)
    assert [(c.threads, c.to, c.reason) for _, c in replayed] == \
        [(c["from"], c["to"], c["reason"]) for c in data["changes"]]
    for i, change in replayed:
        assert any(s["threads"] == change.to for s in samples[i + 1:]), (i, change)


def test_recorded_busy_loop_arriving_and_leaving():
    # bench/record_cpu_samples.py --schedule 10:1,35:0: W1's questions at 160 tokens, a busy loop
    # from 10 s to 35 s.
    data, samples = recorded("arrive-leave.json")
    came = arrival(samples)
    went = departure(samples, came)
    changes = replay_recorded(samples)
    assert [(i - came, c.threads, c.to) for i, c in changes[:1]] == [(1, 2, 1)]  # after 2 intervals
    assert [(i - went, c.threads, c.to) for i, c in changes[1:]] == [(4, 1, 2)]  # after 5 intervals
    assert changes[0][1].reason == "about 0.7 cores of other load on its 2 cores for 2 s"
    # At 1 thread the loop has a core to itself: the worker sees a whole core of other load.
    alone = [s["other"] for s in samples[came + 3:went - 1]]
    assert all(0.9 <= o <= 1.15 for o in alone), alone


def test_recorded_two_busy_loops_give_up_one_thread_and_no_more():
    # --schedule 8:2,30:0; after the loops, other engineers' tests took a core for the rest of the
    # run (this machine is shared), and the worker gave the thread up again.
    data, samples = recorded("two-loops.json")
    came = arrival(samples)
    went = departure(samples, came)
    changes = replay_recorded(samples)
    assert [(c.threads, c.to) for _, c in changes] == [(2, 1), (1, 2), (2, 1)]
    assert changes[0][0] - came == 1 and changes[1][0] - went == 4
    # Two loops beside one thread: about 1.33 cores of other load, and one thread is the floor.
    beside = [s for s in samples[came:went] if s["threads"] == 1]
    assert beside and min(s["other"] for s in beside[1:-1]) > 1.2


def test_recorded_neighbours_arriving():
    # A run without busy loops, while other engineers' runs started on this machine mid-way.
    data, samples = recorded("neighbours.json")
    came = arrival(samples)
    assert [(i - came, c.threads, c.to) for i, c in replay_recorded(samples)] == [(1, 2, 1)]


def test_recorded_loop_from_the_start_is_decided_at_ready():
    # --schedule 0:1 --max-tokens 64: a busy loop from the moment ggbatch starts. The worker's
    # load (1.4 s, its model's pages cached) was the evidence: it ran its first step at 1 thread.
    data, samples = recorded("loop-from-start.json")
    assert samples[0].get("at_ready") and samples[0]["interval_s"] < 2.0  # under a tick's 2 s of evidence
    assert [(i, c.threads, c.to) for i, c in replay_recorded(samples)] == [(0, 2, 1)]
    assert data["changes"][0]["after_steps"] == 0
    assert all(s["threads"] == 1 for s in samples[1:])


def test_an_idle_worker_keeps_its_threads_until_it_works_beside_the_load():
    # A warm pool's caller preparing its next call takes a core while the worker waits for it:
    # no change; the same load once the worker works: one thread given up after two seconds.
    assert replay([load(0.9, own=0.0)] * 10) == []
    changes = replay([load(0.9, own=0.0)] * 10 + [load(0.67)] * 3)
    assert changes == [(12.0, ThreadChange(0, 2, 1, "about 0.7 cores of other load on its 2 cores for 2 s"))]
