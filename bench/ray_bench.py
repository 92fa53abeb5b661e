"""The Ray backend's overhead: the same job on the local backend and on the Ray backend on this
machine, runs alternating, and Ray's own costs measured apart.

    python bench/ray_bench.py [--model M.gguf] [--questions 256] [--max-tokens 64] [--repeat 2]

The model defaults to the benchmark model (~/.cache/ggbatch/bench-28x1024-q4_k_m.gguf, see README
Performance) when it is there, else ../shared/models/stories260K.gguf. The questions are the
first N of GSM8K. Each run is a whole `ggbatch run` command (start-up, model load, answers) timed
from outside, with its report's timings.

Ray's start-up is one-off: this script starts one local Ray instance (ray.init, timed) and every
Ray run joins it with --ray-address, as jobs join a running cluster; the job's own connection
is inside its timing. Per-chunk round trips: one remote call to a worker actor and back, timed
here over 200 calls (each chunk handed out is a send, each batch of answers a poll's return).
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "questions.jsonl"
BENCH_MODEL = Path.home() / ".cache" / "ggbatch" / "bench-28x1024-q4_k_m.gguf"
STORIES = ROOT.parent / "shared" / "models" / "stories260K.gguf"


def questions_file(n: int, folder: str) -> str:
    path = os.path.join(folder, "questions.jsonl")
    with open(GSM8K, encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
        for _, line in zip(range(n), f):
            r = json.loads(line)
            out.write(json.dumps({"questionID": r["questionID"], "question": r["question"]}) + "\n")
    return path


def one_run(args: argparse.Namespace, questions: str, folder: str, extra: list[str]) -> dict[str, float]:
    """A whole ggbatch run: its wall time from outside, and its report's timings."""
    report = os.path.join(folder, "report.json")
    cmd = [sys.executable, "-m", "ggbatch", "run", "--model", args.model, "--input", questions,
           "--output", os.path.join(folder, "answers.json"), "--report", report, "--max-tokens",
           str(args.max_tokens), "--fresh", "--progress", "off", "-q", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    timings = json.loads(Path(report).read_text())["timings_s"]
    return {"wall_s": wall, "run_s": timings["run_s"], "first_worker_ready_s": timings["first_worker_ready_s"]}


def round_trip_ms(model: str) -> float:
    """Median ms of one call to a worker actor and back (a loaded model waiting for work)."""
    import ray

    from ggbatch.runner.plan.nodes import nodes_from_ray
    from ggbatch.workers.ray_actor import RayWorker
    from ggbatch.workers.spec import WorkerSpec

    node = nodes_from_ray(ray.nodes())[0]
    actor: Any = ray.remote(RayWorker).options(num_cpus=1).remote(WorkerSpec(0, (0,), model, node_id=node.node_id))
    ray.get(actor.where.remote())
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        ray.get(actor.next_messages.remote(0.0))
        times.append(1000 * (time.perf_counter() - t0))
    ray.kill(actor)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(BENCH_MODEL if BENCH_MODEL.exists() else STORIES))
    p.add_argument("--questions", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t0
    address = ray.get_runtime_context().gcs_address
    rtt = round_trip_ms(args.model)
    print(f"model {args.model}, {args.questions} questions × {args.max_tokens} tokens")
    print(f"ray.init (a local instance, one-off): {init_s:.2f} s; round trip to a worker actor: {rtt:.2f} ms")
    runs: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as folder:
        questions = questions_file(args.questions, folder)
        for i in range(args.repeat):
            order = ["local", "ray"] if i % 2 == 0 else ["ray", "local"]
            for side in order:
                extra = ["--backend", "ray", "--ray-address", address] if side == "ray" else []
                r = one_run(args, questions, folder, extra)
                runs[side].append(r)
                print(f"  {side:5s} wall {r['wall_s']:.2f} s, run {r['run_s']:.2f} s, "
                      f"first worker ready {r['first_worker_ready_s']:.2f} s", flush=True)
    ray.shutdown()
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    for k in ("wall_s", "run_s", "first_worker_ready_s"):
        print(f"median {k:22s} local {med['local'][k]:7.2f}  ray {med['ray'][k]:7.2f}  "
              f"ray/local {med['ray'][k] / med['local'][k]:.3f}")


if __name__ == "__main__":
    main()
