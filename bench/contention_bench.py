"""W1 on a shared machine: ggbatch alone, beside one busy-looping process, beside two; with the
llama.cpp thread count adapting to the contention (threads_adapt auto) and without.

    python bench/contention_bench.py [--model M.gguf] [--loops 0,1,2] [--adapt auto,off,threads1,workers2]
                                     [--repeat 3] [--workload W1] [--wait-idle 0.3 [--patience 120]]
                                     [--foreign-limit 0.15] [--retries 2] [--log-dir DIR]

--adapt: `auto` and `off` are threads_adapt's settings; `threads1` is one worker of one thread
(`--workers 1 --threads 1`, adapt off: the best fixed count of one worker beside one busy loop on 2
cores; `--threads 1` alone lays out a worker per core); `workers2` is two workers of one thread
each (`--workers 2 --threads 1`, adapt off: no barrier between two processes, and beside one busy
loop three runnable threads share the two cores). A busy loop is `python -c "while True:
pass"`, started a second before ggbatch and killed after it, unpinned (the kernel puts it where
it likes, as it would a cron job).

Every round runs each (loops, adapt) pair once, in the same order, so slow spells fall on every
pair alike. The machine is shared: each run also measures the work of processes that are neither
ggbatch's nor the loops' (the machine's busy time less this script's children's CPU time, over
the run), in cores. A run with more than --foreign-limit of it was disturbed: it is run again
(up to --retries times) and left out of the medians while undisturbed runs of the pair exist.
--wait-idle waits before each run until the machine's busy cores fall under that many. The table
gives the median wall time, as a multiple of the quiet one of threads_adapt auto (the default),
the thread changes the reports recorded, the load average before and the foreign load.

--log-dir keeps each run's `-v` log, whose per-second lines (`worker 0: cores [0, 1] over 1.00 s:
...`) are what the thread controller was fed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from compare_server import TOKENS, Workload, time_ggbatch, workload  # noqa: E402
from engine_bench import bench_model  # noqa: E402

BUSY_LOOP = "while True: pass"
VARIANTS = {"auto": ["--threads-adapt", "auto"], "off": ["--threads-adapt", "off"],
            "threads1": ["--workers", "1", "--threads", "1", "--threads-adapt", "off"],
            "workers2": ["--workers", "2", "--threads", "1", "--threads-adapt", "off"]}


def busy_loops(n: int) -> list[subprocess.Popen[Any]]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores; guest time is inside user time)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - t.iowait - t.guest - t.guest_nice


def children_cpu_s() -> float:
    """CPU seconds of this script's finished children (ggbatch and its workers, the loops)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_idle(limit: float, patience_s: float) -> None:
    """Wait (at most patience_s) until the machine's busy cores over 2 s fall under `limit`."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        before = machine_busy_s()
        time.sleep(2.0)
        if (machine_busy_s() - before) / 2.0 < limit:
            return
        time.sleep(3.0)
    print(f"  (still more than {limit} busy cores after {patience_s:.0f} s: running anyway)", flush=True)


def run_variant(model: str, work: Workload, adapt: str, log: Path | None) -> dict[str, Any]:
    """One whole `ggbatch run` (-v): its wall time and the report's thread changes."""
    run = time_ggbatch(model, work, [*VARIANTS[adapt], "-v"])
    if log is not None:  # the wall time last: the log alone says what the run took
        log.write_bytes(run.stderr + f"contention_bench: {adapt}: wall {run.wall:.2f} s\n".encode())
    return {"wall": run.wall, "changes": run.report["threads"]["changes"]}


def one_run(model: str, work: Workload, loops: int, adapt: str, log: Path | None) -> dict[str, Any]:
    """One run beside `loops` busy loops; `foreign`: cores' worth of everybody else's work meanwhile."""
    load = os.getloadavg()[0]
    busy0, mine0, t0 = machine_busy_s(), children_cpu_s(), time.perf_counter()
    procs = busy_loops(loops)
    try:
        time.sleep(1.0 if loops else 0.0)
        out = run_variant(model, work, adapt, log)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    elapsed = time.perf_counter() - t0
    foreign = max(0.0, (machine_busy_s() - busy0) - (children_cpu_s() - mine0)) / elapsed
    moves = ", ".join(f"{c['from']}→{c['to']} at {c['t_s']:.0f} s" for c in out["changes"]) or "none"
    print(f"  loops {loops}  {adapt:>8}  load before {load:4.2f}  foreign {foreign:4.2f} cores  "
          f"wall {out['wall']:6.1f} s  thread changes: {moves}", flush=True)
    return {**out, "load": load, "foreign": foreign}


def summary(results: dict[tuple[int, str], list[dict[str, Any]]], limit: float) -> None:
    clean = {k: [r for r in runs if r["foreign"] <= limit] or runs for k, runs in results.items()}
    median = {k: statistics.median(r["wall"] for r in runs) for k, runs in clean.items()}
    print(f"\n{'loops':>5} {'adapt':>8} {'median wall s':>13} {'× quiet':>8} {'runs':>7} {'load before':>11} "
          f"{'foreign':>9}  changes")
    for (loops, adapt), runs in sorted(clean.items()):
        quiet = median.get((0, "auto"), median.get((0, adapt)))
        ratio = f"{median[(loops, adapt)] / quiet:.2f}" if quiet else "-"
        used = f"{len(runs)}/{len(results[(loops, adapt)])}"
        loads = f"{min(r['load'] for r in runs):.1f}-{max(r['load'] for r in runs):.1f}"
        foreign = f"{min(r['foreign'] for r in runs):.2f}-{max(r['foreign'] for r in runs):.2f}"
        changes = sorted({f"{c['from']}→{c['to']}" for r in runs for c in r["changes"]})
        print(f"{loops:>5} {adapt:>8} {median[(loops, adapt)]:>13.1f} {ratio:>8} {used:>7} {loads:>11} "
              f"{foreign:>9}  {' '.join(changes) or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--workload", default="W1")
    ap.add_argument("--loops", default="0,1,2", help="busy loops beside ggbatch, one setting per run")
    ap.add_argument("--adapt", default="auto,off", help="auto, off, threads1, workers2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wait-idle", type=float, metavar="CORES", help="wait before each run until the machine's "
                    "busy cores fall under CORES")
    ap.add_argument("--patience", type=float, default=120.0, metavar="S",
                    help="--wait-idle waits at most this long (default 120 s)")
    ap.add_argument("--foreign-limit", type=float, default=0.15, metavar="CORES",
                    help="a run with more foreign load was disturbed (default 0.15 cores)")
    ap.add_argument("--retries", type=int, default=2, help="runs again a disturbed run up to this many times")
    ap.add_argument("--log-dir", help="keep each run's -v log here")
    args = ap.parse_args()
    model = args.model or bench_model()
    work = workload(args.workload)
    if work.tokens != TOKENS:
        raise SystemExit(f"{args.workload}: this bench runs the {TOKENS}-token workloads (W1, W2, W4)")
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    print(f"model {model}, {args.workload}: {len(work.records)} questions × {TOKENS} tokens, "
          f"{len(os.sched_getaffinity(0))} usable cores")
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rnd in range(args.repeat):
        print(f"round {rnd + 1}/{args.repeat}", flush=True)
        for loops in (int(n) for n in args.loops.split(",")):
            for adapt in args.adapt.split(","):
                for attempt in range(args.retries + 1):
                    if args.wait_idle is not None:
                        wait_idle(args.wait_idle, args.patience)
                    log = log_dir / f"r{rnd}-loops{loops}-{adapt}-{attempt}.log" if log_dir else None
                    run = one_run(model, work, loops, adapt, log)
                    results.setdefault((loops, adapt), []).append(run)
                    if run["foreign"] <= args.foreign_limit:
                        break
    summary(results, args.foreign_limit)


if __name__ == "__main__":
    main()
