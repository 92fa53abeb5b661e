"""W1 on a shared machine: ggbatch alone, beside one busy-looping process, beside two; with the
llama.cpp thread count adapting to the contention (threads_adapt auto) and without (off).

    python bench/contention_bench.py [--model M.gguf] [--loops 0,1,2] [--adapt auto,off] [--repeat 3]
                                     [--workload W1] [--log-dir DIR]

Every round runs each (loops, adapt) pair once, in the same order, so slow spells of a shared
machine fall on every pair alike; the medians over the rounds are printed, with the wall time as
a multiple of the quiet one (same adapt setting) and the thread changes the reports recorded. A
busy loop is `python -c "while True: pass"`, started a second before ggbatch and killed after
it, unpinned (the kernel puts it where it likes, as it would a cron job). The load average
before each run is printed: measure when the machine is otherwise quiet.

--log-dir keeps each run's `-v` log, whose per-second lines (`worker 0: cores [0, 1] over 1.00 s:
...`) are what the thread controller was fed (tests/data/threads/ holds some).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from compare_server import TOKENS, workload  # noqa: E402
from engine_bench import bench_model  # noqa: E402

BUSY_LOOP = "while True: pass"


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]


def run_ggbatch(model: str, system: str, records: list[dict], adapt: str, log: Path | None) -> dict:
    """One whole `ggbatch run`: its wall time and the report's thread changes."""
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "q.jsonl"
        q.write_text("".join(json.dumps({"questionID": r["questionID"], "question": r["question"]}) + "\n"
                             for r in records))
        cmd = [sys.executable, "-m", "ggbatch", "run", "--model", model, "--input", str(q),
               "--output", str(Path(tmp) / "a.json"), "--system", system, "--max-tokens", str(TOKENS),
               "--ignore-eos", "--report", str(Path(tmp) / "r.json"), "--progress", "log",
               "--threads-adapt", adapt, "-v"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if log is not None:
            log.write_text(done.stderr)
        report = json.loads((Path(tmp) / "r.json").read_text())
        assert report["tokens"]["generated"] == TOKENS * len(records), report["tokens"]
        return {"wall": wall, "changes": report["threads"]["changes"]}


def one_run(model: str, system: str, records: list[dict], loops: int, adapt: str, log: Path | None) -> dict:
    load = os.getloadavg()[0]
    procs = busy_loops(loops)
    try:
        time.sleep(1.0 if loops else 0.0)
        out = run_ggbatch(model, system, records, adapt, log)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    moves = ", ".join(f"{c['from']}→{c['to']} at {c['t_s']:.0f} s" for c in out["changes"]) or "none"
    print(f"  loops {loops}  adapt {adapt:>4}  load before {load:4.2f}  wall {out['wall']:6.1f} s  "
          f"thread changes: {moves}", flush=True)
    return {**out, "load": load}


def summary(results: dict[tuple[int, str], list[dict]]) -> None:
    print(f"\n{'loops':>5} {'adapt':>5} {'median wall s':>13} {'× quiet':>8} {'runs':>4} {'load before':>11}  changes")
    for (loops, adapt), runs in sorted(results.items()):
        wall = statistics.median(r["wall"] for r in runs)
        quiet = results.get((0, adapt))
        ratio = f"{wall / statistics.median(r['wall'] for r in quiet):.2f}" if quiet else "-"
        loads = f"{min(r['load'] for r in runs):.1f}-{max(r['load'] for r in runs):.1f}"
        changes = sorted({f"{c['from']}→{c['to']}" for r in runs for c in r["changes"]})
        print(f"{loops:>5} {adapt:>5} {wall:>13.1f} {ratio:>8} {len(runs):>4} {loads:>11}  {' '.join(changes) or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--workload", default="W1")
    ap.add_argument("--loops", default="0,1,2", help="busy loops beside ggbatch, one setting per run")
    ap.add_argument("--adapt", default="auto,off", help="threads_adapt settings to compare")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--log-dir", help="keep each run's -v log here")
    args = ap.parse_args()
    model = args.model or bench_model()
    system, records = workload(args.workload)
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    print(f"model {model}, {args.workload}: {len(records)} questions × {TOKENS} tokens, "
          f"{len(os.sched_getaffinity(0))} usable cores")
    results: dict[tuple[int, str], list[dict]] = {}
    for rnd in range(args.repeat):
        print(f"round {rnd + 1}/{args.repeat}", flush=True)
        for loops in (int(n) for n in args.loops.split(",")):
            for adapt in args.adapt.split(","):
                log = log_dir / f"r{rnd}-loops{loops}-{adapt}.log" if log_dir else None
                results.setdefault((loops, adapt), []).append(one_run(model, system, records, loops, adapt, log))
    summary(results)


if __name__ == "__main__":
    main()
