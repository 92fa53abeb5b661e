"""Record what the thread controller (runner/watch/thread_controller.py) is fed during a real run, with busy loops
started and stopped on a schedule, for the tests (tests/data/threads/).

    python bench/record_cpu_samples.py --schedule 10:1,35:0 --out tests/data/threads/arrive-leave.json
                                       [--model M.gguf] [--questions 32] [--max-tokens 160] [--adapt auto]

--schedule: `SECONDS:LOOPS,...`: that many busy loops (`python -c "while True: pass"`) from that
many seconds after ggbatch starts. The run is W1's questions (GSM8K, short system prompt) with
`-v`, whose per-second lines (`worker 0: cores [0, 1] over 1.00 s: 2.00 busy, 1.33 its own, 0.67
other (0.00 steal) cores; 2 llama.cpp threads`) are kept in order, with the thread changes the
report recorded and the machine's load average before the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from compare_server import SYSTEM  # noqa: E402
from contention_bench import busy_loops  # noqa: E402
from engine_bench import GSM8K, bench_model  # noqa: E402

SAMPLE = re.compile(r"worker (\d+): cores \[([\d, ]+)\] over ([\d.]+) s"
                    r"( from the job's start to its Ready)?: ([\d.]+) busy, ([\d.]+) its own, "
                    r"([\d.]+) other \(([\d.]+) steal\) cores; (\d+) llama.cpp threads")


def parse_samples(log: str) -> list[dict[str, Any]]:
    """The controller's input lines of a -v log, as numbers (per-second rates in cores). A
    worker's interval from the job's start to its Ready (which spans the ticks before it) is
    marked `at_ready`."""
    out = []
    for m in SAMPLE.finditer(log):
        sample = {"worker": int(m[1]), "cores": len(m[2].split(",")), "interval_s": float(m[3]),
                  "busy": float(m[5]), "own": float(m[6]), "other": float(m[7]), "steal": float(m[8]),
                  "threads": int(m[9])}
        out.append({**sample, "at_ready": True} if m[4] else sample)
    return out


def follow_schedule(proc: subprocess.Popen[Any], schedule: list[tuple[float, int]]) -> None:
    """Start and stop busy loops on schedule while ggbatch runs."""
    t0 = time.monotonic()
    loops: list[subprocess.Popen[Any]] = []
    try:
        for at, n in schedule:
            while proc.poll() is None and time.monotonic() - t0 < at:
                time.sleep(0.05)
            while len(loops) > n:
                loops.pop().kill()
            loops += busy_loops(n - len(loops))
        proc.wait()
    finally:
        for p in loops:
            p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--adapt", default="auto")
    args = ap.parse_args()
    schedule = [(float(a), int(n)) for a, n in (item.split(":") for item in args.schedule.split(","))]
    model = args.model or bench_model()
    with open(GSM8K, encoding="utf-8") as f:
        records = [json.loads(line) for _, line in zip(range(args.questions), f)]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        q, report = Path(tmp) / "q.jsonl", Path(tmp) / "r.json"
        q.write_text("".join(json.dumps({"questionID": r["questionID"], "question": r["question"]}) + "\n"
                             for r in records))
        cmd = [sys.executable, "-m", "ggbatch", "run", "--model", model, "--input", str(q), "--output",
               str(Path(tmp) / "a.json"), "--system", SYSTEM, "--max-tokens", str(args.max_tokens), "--ignore-eos",
               "--report", str(report), "--progress", "log", "--threads-adapt", args.adapt, "-v"]
        with open(Path(tmp) / "log", "w+") as log:
            follow_schedule(subprocess.Popen(cmd, cwd=ROOT, stderr=log, stdout=subprocess.DEVNULL), schedule)
            log.seek(0)
            samples = parse_samples(log.read())
        changes = json.loads(report.read_text())["threads"]["changes"]
    head = {"recorded": time.strftime("%Y-%m-%d %H:%M"), "load_average_before": round(load, 2),
            "schedule": args.schedule, "model": Path(model).name, "questions": args.questions,
            "max_tokens": args.max_tokens, "threads_adapt": args.adapt, "changes": changes}
    Path(args.out).write_text(dump(head, samples))
    print(f"{len(samples)} samples, changes {changes}, load before {load:.2f}: {args.out}")


def dump(head: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    """JSON with one sample a line: readable, and a diff shows which samples changed."""
    lines = ",\n".join("  " + json.dumps(s) for s in samples)
    return json.dumps(head, indent=1)[:-2] + ',\n "samples": [\n' + lines + "\n ]\n}\n"


if __name__ == "__main__":
    main()
