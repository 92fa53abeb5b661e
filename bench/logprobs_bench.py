"""Top-5 token log-probabilities on W1: the same `ggbatch run` with and without `--token-logprobs 5`,
in alternating runs, each timed as the whole command (start-up, model load, tokenizing, answering,
writing), with where the engine spent its steps. The target: at most 1.10× the time without.

    python bench/logprobs_bench.py [--model M.gguf] [--workload W1] [--k 5] [--repeat 3] [--json F]
        [--gpu-layers all]

W1 is bench/compare_server.py's (the first 32 GSM8K questions, 64 generated tokens each). The model
defaults to the benchmark model (~/.cache/ggbatch/bench-28x1024-q4_k_m.gguf, built from the Qwen2
vocabulary when absent: a 151,936-token vocabulary, where a log-softmax per token costs most).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from compare_server import gpu_flags, time_ggbatch, workload  # noqa: E402
from engine_bench import bench_model  # noqa: E402


def one_run(model: str, name: str, flags: list[str]) -> dict[str, Any]:
    run = time_ggbatch(model, workload(name), ["--fresh", *flags])
    engine = [w["engine"] for w in run.report["workers"].values() if w.get("engine")]
    work = {k: sum(e.get(k, 0.0) for e in engine) for k in ("step_s", "decode_s", "sample_s", "logprob_s")}
    return {"wall_s": run.wall, **work}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--workload", default="W1")
    ap.add_argument("--k", type=int, default=5, help="alternatives per token")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the runs here")
    ap.add_argument("--gpu-layers", default="0", help="layers on the GPU on both sides: N or all (default 0)")
    args = ap.parse_args()
    model = args.model or bench_model()
    gpu = gpu_flags(args.gpu_layers)
    sides = {"without": gpu, "with": [*gpu, "--token-logprobs", str(args.k)]}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for round_ in range(args.repeat):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))  # alternate who goes first
        for side in order:
            got = one_run(model, args.workload, sides[side])
            runs[side].append(got)
            print(f"round {round_ + 1} {side:8s} {got['wall_s']:7.2f} s (engine steps {got['step_s']:.2f} s: "
                  f"llama_decode {got['decode_s']:.2f}, sampling {got['sample_s']:.3f}, of it log-probabilities "
                  f"{got['logprob_s']:.3f})", flush=True)
    medians = {side: statistics.median(r["wall_s"] for r in runs[side]) for side in sides}
    ratio = medians["with"] / medians["without"]
    print(f"median {medians['without']:.2f} s without, {medians['with']:.2f} s with top-{args.k} token "
          f"log-probabilities: {ratio:.3f}× (target: at most 1.10×)")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model, "workload": args.workload, "k": args.k,
                                               "runs": runs, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
