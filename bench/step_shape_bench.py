"""What one llama_decode costs by the shape of its batch, on the model runner alone (no engine).

    python bench/step_shape_bench.py [--model M.gguf] [--threads 2] [--repeat 3] [--flash-attn on|off]

- prefill: 512 tokens at positions 100-611 split among sequences as 1 × 512, 2 × 256, 4 × 128,
  16 × 32, and unevenly (300/50/20/142; eight from 120 down to 32), one KV stream per sequence,
  plain weights. Tokens per second for each split (median of --repeat).
- decode: one token for each of 32 sequences whose KV holds 200 and 1,000 tokens (a decode step
  reads every sequence's cells). Milliseconds per step.
- decode widths: one token for each of 32, 64, 128 and 256 sequences of 100 tokens, every row's
  logits computed (as sampling needs them). Tokens per second: whether a wider step computes a
  token faster (samples_bench.py's n = 8 decodes 64 sequences a step, llama-server 32).

Where a lm-eval MMLU run (prefill in uneven chunks) and GSM8K (decode over long few-shot
contexts) spend their time, and whether a wider decode step computes a token faster:
docs/performance/pools-and-weighing.md, fourth and fifth sittings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from engine_bench import bench_model  # noqa: E402
from ggbatch.workers.llama.model_runner import ModelRunner  # noqa: E402

SPLITS = {"1 x 512": [512], "2 x 256": [256] * 2, "4 x 128": [128] * 4, "16 x 32": [32] * 16,
          "uneven 4": [300, 50, 20, 142], "uneven 8": [120, 90, 70, 60, 50, 50, 40, 32]}
START = 100  # prefill chunks go in after this many tokens of each sequence


def decode(runner: ModelRunner, chunks: list[tuple[int, int, int]], rng: np.random.Generator,
           every_row: bool = False) -> float:
    """Seconds of one llama_decode of `chunks` (sequence, first position, tokens), the last row's
    logits (every row's with every_row)."""
    tokens = np.concatenate([rng.integers(100, 5000, n) for _, _, n in chunks]).astype(np.int32)
    pos = np.concatenate([np.arange(p, p + n) for _, p, n in chunks]).astype(np.int32)
    seqs = np.concatenate([np.full(n, s) for s, _, n in chunks]).astype(np.int32)
    logits = np.full(len(tokens), int(every_row), np.int8)
    logits[-1] = 1
    t0 = time.perf_counter()
    if runner.decode(tokens, pos, seqs, logits) != 0:
        raise RuntimeError("llama_decode found no KV room for the batch")
    return time.perf_counter() - t0


def fill(runner: ModelRunner, n_seqs: int, n: int, rng: np.random.Generator) -> None:
    """Each sequence's first n positions: sequence 0's computed, 512 tokens a decode, and its
    stream copied to the others (as the prefix cache starts a prompt from a held one)."""
    for p in range(0, n, 512):
        decode(runner, [(0, p, min(512, n - p))], rng)
    for s in range(1, n_seqs):
        runner.seq_cp(0, s, -1, -1)


def prefill_rates(model: str, threads: int, repeat: int, flash_attn: bool) -> dict[str, float]:
    runner = ModelRunner(model, threads, n_ctx=16 * 800, n_seq_max=16, n_batch=512, kv_unified=False,
                         flash_attn=flash_attn, repack=False)
    rng = np.random.default_rng(0)
    try:
        fill(runner, 16, START, rng)
        out = {}
        for name, split in SPLITS.items():
            took = []
            for _ in range(repeat):
                for s in range(len(split)):
                    runner.seq_rm(s, START, -1)
                took.append(decode(runner, [(s, START, n) for s, n in enumerate(split)], rng))
            out[name] = 512 / statistics.median(took)
        return out
    finally:
        runner.close()


def decode_step_s(model: str, threads: int, repeat: int, flash_attn: bool, context: int, n_seqs: int,
                  every_row: bool = False) -> float:
    """Median seconds of a decode step of one token for each of n_seqs sequences holding `context`
    tokens (the first step, which also pays for the deferred stream copies, left out)."""
    runner = ModelRunner(model, threads, n_ctx=n_seqs * (context + 64), n_seq_max=n_seqs, n_batch=512,
                         kv_unified=False, flash_attn=flash_attn, repack=False)
    rng = np.random.default_rng(0)
    try:
        fill(runner, n_seqs, context, rng)
        took = [decode(runner, [(s, context + k, 1) for s in range(n_seqs)], rng, every_row)
                for k in range(repeat + 1)]
        return statistics.median(took[1:])
    finally:
        runner.close()


def runner_bench_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a bench on the model runner alone: --model, --threads, --repeat."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each shape (at least 1)")
    return parser


def main() -> None:
    parser = runner_bench_parser(__doc__)
    parser.add_argument("--flash-attn", choices=["on", "off"], default="off")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1 (each shape's median needs a timed run)")
    model, fa = args.model or bench_model(), args.flash_attn == "on"
    for name, rate in prefill_rates(model, args.threads, args.repeat, fa).items():
        print(f"prefill {name:>9}: {rate:6.1f} tokens/s", flush=True)
    for context in (200, 1000):
        ms = 1000 * decode_step_s(model, args.threads, args.repeat, fa, context, 32)
        print(f"decode 32 sequences at {context} tokens: {ms:.0f} ms", flush=True)
    for n_seqs in (32, 64, 128, 256):
        rate = n_seqs / decode_step_s(model, args.threads, args.repeat, fa, 100, n_seqs, every_row=True)
        print(f"decode {n_seqs:>3} sequences, every row's logits: {rate:6.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
