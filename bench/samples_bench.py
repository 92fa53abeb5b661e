"""n samples per question from one computation of its prompt: the same W1 job (32 GSM8K questions,
64 tokens each, temperature 0.8) at n = 1 and n = 8, each timed as a whole command, with the prompt
tokens each computed (the report's prefix_cache.prompt_tokens_computed: n = 8 must compute no more
than n = 1) and the tokens generated.

    python bench/samples_bench.py [--model M.gguf] [--workload W1] [--n 8] [--repeat 1] [--gpu-layers all]
        [--server PATH/llama-server [--server-args "-fa off"]]

The model defaults to the benchmark model (~/.cache/ggbatch/bench-28x1024-q4_k_m.gguf, built when
absent, as bench/engine_bench.py builds it). Exit 1 when n samples computed more prompt tokens.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from compare_server import Workload, gpu_flags, run_server, workload  # noqa: E402
from engine_bench import bench_model  # noqa: E402


def run(model: str, work: Workload, n: int, gpu_layers: str) -> tuple[float, dict[str, Any]]:
    """One whole `ggbatch run` of the workload with n samples a question: (wall seconds, report)."""
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "q.jsonl"
        q.write_text("".join(json.dumps({"questionID": r["questionID"], "question": r["question"]}) + "\n"
                             for r in work.records))
        cmd = [sys.executable, "-m", "ggbatch", "run", "--model", model, "--input", str(q),
               "--output", str(Path(tmp) / "a.jsonl"), "--system", work.system, "--max-tokens", str(work.tokens),
               "--ignore-eos", "--temperature", "0.8", "--n", str(n), "--report", str(Path(tmp) / "r.json"),
               "--progress", "off", *gpu_flags(gpu_layers)]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        report = json.loads((Path(tmp) / "r.json").read_text())
    assert report["tokens"]["generated"] == n * work.tokens * len(work.records), report["tokens"]
    return wall, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--workload", default="W1")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--gpu-layers", default="0", help="layers on the GPU on both sides: N or all (default 0)")
    ap.add_argument("--server", help="also llama-server (its path) asked for n completions a request, -np 32 and "
                                     "32 clients, alternated with ggbatch's n run (see bench/compare_server.py)")
    ap.add_argument("--server-args", default="", help="more flags for llama-server, as one string: \"-fa off\"")
    args = ap.parse_args()
    model = args.model or bench_model()
    work = workload(args.workload)
    computed: dict[int, int] = {}
    for round_ in range(args.repeat):
        for n in (1, args.n):
            wall, report = run(model, work, n, args.gpu_layers)
            cache, lay = report["prefix_cache"], report["layout"]
            computed[n] = cache["prompt_tokens_computed"]
            engine = [w["engine"] for w in report["workers"].values() if w.get("engine")]
            steps = {k: sum(e.get(k, 0.0) for e in engine) for k in ("step_s", "decode_s", "sample_s")}
            print(f"round {round_ + 1} n={n:<3d} {wall:7.2f} s, prompt tokens computed {computed[n]}, generated "
                  f"{report['tokens']['generated']}, samples forked {cache['sample_forks']}, "
                  f"{lay['workers']}w x {lay['threads_per_worker']}t x {lay['slots_per_worker']} slots; engine steps "
                  f"{steps['step_s']:.2f} s (llama_decode {steps['decode_s']:.2f}, picking tokens "
                  f"{steps['sample_s']:.2f})", flush=True)
    if args.server:
        compare_server_n(args.server, model, work, args.n, args.repeat, args.gpu_layers, shlex.split(args.server_args))
    same = computed[args.n] <= computed[1]
    print(f"prompt tokens computed: {computed[1]} at n=1, {computed[args.n]} at n={args.n} "
          f"({'no more' if same else 'MORE'})")
    return 0 if same else 1


def compare_server_n(server: str, model: str, work: Workload, n: int, repeat: int, gpu_layers: str,
                     server_args: list[str]) -> None:
    """ggbatch's whole command against llama-server's answering alone (loaded first: the
    comparison favours the server), alternated; medians."""
    ours, theirs = [], []
    for _ in range(repeat):
        ours.append(run(model, work, n, gpu_layers)[0])
        theirs.append(run_server(server, model, work, [*gpu_flags(gpu_layers, "-ngl"), *server_args], parallel=32, n=n,
                                 temperature=0.8))
        print(f"n={n}: ggbatch {ours[-1]:.2f} s, llama-server {theirs[-1]:.2f} s", flush=True)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"median n={n}: ggbatch {a:.2f} s, llama-server {b:.2f} s: ggbatch {b / a:.2f}x as fast")


if __name__ == "__main__":
    sys.exit(main())
