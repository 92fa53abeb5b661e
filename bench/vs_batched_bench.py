"""Does `ggbatch bench` measure what llama.cpp's own llama-batched-bench measures?

    python bench/vs_batched_bench.py --batched-bench PATH/llama-batched-bench [--model M.gguf]
        [--npp 128] [--ntg 64] [--npl 1,4,8,16] [--rounds 3] [--gpu-layers all] [--json F]

Both tools run in turns, one B at a time and in fresh processes (llama-batched-bench and
`ggbatch bench --no-runner`, alternating which goes first), so slow and fast moments of a shared
machine fall on both. For every B it prints
the median over the rounds of S_PP, S_TG and S from each tool and the gap in percent
(ggbatch / batched-bench - 1). Both use one context with one KV stream per sequence, flash
attention on auto, a warm-up decode first, the same threads, at most 512 tokens per decode, and
the same weight layout: repacked or not as `ggbatch run` would decide on this CPU for B
sequences per worker (--repack overrides; llama-batched-bench gets --no-repack when not).
--gpu-layers N|all stores that many layers on the first GPU in both (llama-batched-bench's -ngl);
the weights on a GPU are never repacked (repacking is a CPU layout).

Build llama-batched-bench from the llama.cpp sources inside the pinned llama-cpp-python source
package (see bench/compare_server.py); do not commit the binary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from engine_bench import bench_model  # noqa: E402
from ggbatch.runner.config.checks import bool_or_auto  # noqa: E402
from ggbatch.runner.plan.layout import usable_cores  # noqa: E402
from ggbatch.runner.plan.repack import cpu_flags, repack_weights  # noqa: E402

Rates = dict[tuple[int, int, int], dict[str, float]]  # (PP, TG, B) -> metric -> tokens/s
METRICS = ("S_PP", "S_TG", "S")


def run_batched_bench(binary: str, model: str, npp: str, ntg: str, npl: str, threads: int,
                      repack: bool, gpu_layers: str = "0") -> Rates:
    # -b 512: ggbatch's engine takes at most n_batch = 512 tokens per llama_decode. With its
    # default -b 2048 batched-bench hands llama.cpp all 16 prompts of 128 tokens at once, which
    # it splits into ubatches of 16 sequences x 32 tokens: 7-10% slower prompt processing here.
    # -c: llama-batched-bench silently skips a row whose B × (PP + TG) cells exceed its context
    # (4096 by default), so each B gets a context of exactly that size (npl is one B here).
    n_ctx = max(int(b) for b in npl.split(",")) * (max(map(int, npp.split(","))) + max(map(int, ntg.split(","))))
    out = subprocess.run([binary, "-m", model, "-npp", npp, "-ntg", ntg, "-npl", npl, "-t", str(threads),
                          "-c", str(n_ctx),
                          "-b", "512", "-ub", "512", "--output-format", "jsonl", "-ngl", gpu_layers,
                          *([] if repack else ["--no-repack"])],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {(r["pp"], r["tg"], r["pl"]): {"S_PP": r["speed_pp"], "S_TG": r["speed_tg"], "S": r["speed"]}
            for r in rows}


def run_ggbatch(model: str, npp: str, ntg: str, npl: str, threads: int, repack: bool,
                gpu_layers: str = "0") -> Rates:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        subprocess.run([sys.executable, "-m", "ggbatch", "bench", "--model", model, "--npp", npp, "--ntg", ntg,
                        "--npl", npl, "--threads", str(threads), "--no-runner", "--json", str(out),
                        "--repack", "true" if repack else "false", "--gpu-layers", gpu_layers],
                       cwd=ROOT, capture_output=True, text=True, check=True)
        rows = json.loads(out.read_text())["raw"]
    return {(r["PP"], r["TG"], r["B"]): {"S_PP": r["S_PP t/s"], "S_TG": r["S_TG t/s"], "S": r["S t/s"]}
            for r in rows}


def medians(rounds: list[Rates]) -> Rates:
    return {key: {m: statistics.median(r[key][m] for r in rounds) for m in METRICS} for key in rounds[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batched-bench", required=True, help="path to llama-batched-bench")
    ap.add_argument("--model")
    ap.add_argument("--npp", default="128")
    ap.add_argument("--ntg", default="64")
    ap.add_argument("--npl", default="1,4,8,16")
    ap.add_argument("--threads", type=int, default=len(usable_cores()))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repack", choices=["auto", "true", "false"], default="auto")
    ap.add_argument("--gpu-layers", default="0", help="layers on the first GPU, N or all (default 0)")
    ap.add_argument("--json", help="also write every round of both tools here")
    args = ap.parse_args()
    model = args.model or bench_model()
    requested, flags = bool_or_auto(args.repack), cpu_flags()
    gpu = args.gpu_layers not in ("0", "")
    repacked = {b: not gpu and repack_weights(requested, None, flags, int(b))[0] for b in args.npl.split(",")}
    # llama-batched-bench reads -ngl all as every layer, as ggbatch's --gpu-layers all does.
    tools = {"batched-bench": lambda b: run_batched_bench(args.batched_bench, model, args.npp, args.ntg, b,
                                                          args.threads, repacked[b], args.gpu_layers),
             "ggbatch": lambda b: run_ggbatch(model, args.npp, args.ntg, b, args.threads, repacked[b],
                                              args.gpu_layers)}
    runs: dict[str, list[Rates]] = {name: [] for name in tools}
    for i in range(args.rounds):
        # One B at a time, the two tools back to back, in ABBA order: a slow spell of the
        # machine then lands on both tools rather than on one.
        results: dict[str, Rates] = {name: {} for name in tools}
        for j, b in enumerate(args.npl.split(",")):
            for name in (list(tools) if (i + j) % 2 == 0 else list(tools)[::-1]):
                results[name].update(tools[name](b))
        for name in tools:
            runs[name].append(results[name])
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({name: [{",".join(map(str, k)): v for k, v in r.items()} for r in rounds]
                                               for name, rounds in runs.items()}, indent=1) + "\n")
    ref, ours = medians(runs["batched-bench"]), medians(runs["ggbatch"])
    print(f"model {model}, {args.threads} threads, GPU layers {args.gpu_layers}, median of {args.rounds} "
          "alternating rounds; weights "
          f"repacked at B = {[int(b) for b, r in repacked.items() if r]}, not at the others")
    print("| PP | TG | B | " + " | ".join(f"bb {m} | gg {m} | gap" for m in METRICS) + " |")
    print("|---" * (3 + 3 * len(METRICS)) + "|")
    for key in sorted(ref):
        cells = []
        for m in METRICS:
            a, b = ref[key][m], ours[key][m]
            cells += [f"{a:.1f}", f"{b:.1f}", f"{100 * (b / a - 1):+.0f}%"]
        print("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    worst = max(abs(ours[k][m] / ref[k][m] - 1) for k in ref for m in METRICS)
    print(f"largest gap: {100 * worst:.0f}% (target: within 10%)")


if __name__ == "__main__":
    main()
