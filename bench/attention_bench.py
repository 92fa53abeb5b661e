"""llama.cpp's flash attention against its plain path on this machine, on the model runner alone
(no engine): what runner/plan/attention.py decides `flash_attn: auto` from.

    python bench/attention_bench.py [--model M.gguf] [--threads 2] [--repeat 3]

- prefill: 512 prompt tokens of one sequence after 0, 1,000 and 3,000 tokens of it (tokens/s);
- decode: a step of one token for each of 32 sequences holding 100, 1,000 and 3,000 tokens (ms),
  one KV stream per sequence, plain weights, both with flash attention on and off.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from engine_bench import bench_model  # noqa: E402
from ggbatch.workers.llama.model_runner import ModelRunner  # noqa: E402
from step_shape_bench import decode, decode_step_s, fill, runner_bench_parser  # noqa: E402

CONTEXTS = (0, 1000, 3000)
DECODE_CONTEXTS = (100, 1000, 3000)


def prefill_rate(model: str, threads: int, repeat: int, flash_attn: bool, position: int) -> float:
    """Tokens/s of 512 prompt tokens of one sequence at `position` (median of `repeat`)."""
    runner = ModelRunner(model, threads, n_ctx=position + 768, n_seq_max=1, n_batch=512, kv_unified=False,
                         flash_attn=flash_attn, repack=False)
    rng = np.random.default_rng(0)
    try:
        if position:
            fill(runner, 1, position, rng)
        took = []
        for _ in range(repeat):
            runner.seq_rm(0, position, -1)
            took.append(decode(runner, [(0, position, 512)], rng))
        return 512 / statistics.median(took)
    finally:
        runner.close()


def main() -> None:
    parser = runner_bench_parser(__doc__)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    model = args.model or bench_model()
    for on in (True, False):
        name = "on " if on else "off"
        for position in CONTEXTS:
            rate = prefill_rate(model, args.threads, args.repeat, on, position)
            print(f"flash attention {name}: 512 prompt tokens after {position:>5}: {rate:6.1f} tokens/s", flush=True)
        for context in DECODE_CONTEXTS:
            ms = 1000 * decode_step_s(model, args.threads, args.repeat, on, context, 32)
            print(f"flash attention {name}: a step of 32 sequences at {context:>5} tokens: {ms:6.0f} ms", flush=True)


if __name__ == "__main__":
    main()
