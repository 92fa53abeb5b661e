"""The prefix cache on questions that share passages: LSAT-RC's first 64 questions (../shared/data),
32 generated tokens, with `--prefix-cache auto` and `off`, in file order and shuffled, in
alternating turns of the same sitting.

    python bench/prefix_bench.py [--model M.gguf] [--repeat 3] [--ggbatch-args '--workers 2']

Prints each run's wall time (the whole command) and prompt tokens computed, then the medians and
the ratio of off to auto.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from compare_server import run_ggbatch, workload  # noqa: E402
from engine_bench import bench_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workloads", default="LSAT,LSAT-shuffled")
    ap.add_argument("--ggbatch-args", default="")
    args = ap.parse_args()
    model = args.model or bench_model()
    print(f"model {model}")
    walls: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for name in args.workloads.split(","):
            for mode in ("auto", "off"):
                wall = run_ggbatch(model, workload(name), ["--prefix-cache", mode, *args.ggbatch_args.split()])
                walls.setdefault((name, mode), []).append(wall)
                print(f"{name:>14} prefix_cache {mode:>4}: {wall:7.1f} s", flush=True)
    for name in args.workloads.split(","):
        auto, off = statistics.median(walls[name, "auto"]), statistics.median(walls[name, "off"])
        print(f"{name}: median of {args.repeat}: auto {auto:.1f} s, off {off:.1f} s, off / auto {off / auto:.2f}×")


if __name__ == "__main__":
    main()
