"""Token log-probabilities worked out during the next decode (workers/llama/later_logprobs.py)
against before it, where llama.cpp's threads leave the worker's cores free: as on a GPU, where a
worker runs one llama.cpp thread on several cores. Imitated on a CPU with one llama.cpp thread and
the worker's other cores for the host's work: W1's prompts (the first 32 GSM8K questions in the
model's chat template, 64 tokens each, greedy) through one engine, rounds of each mode alternated.

    python bench/later_logprobs_bench.py [--model M.gguf] [--k 5] [--repeat 3] [--threads 1] [--gpu-layers all]

Modes: none (no log-probabilities), before (each step's before the next decode), later (during
it). Prints each round's time and where the engine spent it, then the medians and the ratios to
none. The model defaults to the benchmark model; the proxy (`ggbatch make-model --shape demo
--vocab ../shared/models/ggml-vocab-qwen2.gguf proxy.gguf`, its 151,936-token vocabulary on two
small layers) makes the host's work as large beside the decode as on a GPU. On a GPU machine,
`--gpu-layers all` measures the real thing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from compare_server import SYSTEM  # noqa: E402
from engine_bench import bench_model, load_questions  # noqa: E402
from ggbatch.runner.config.checks import GPU_ALL  # noqa: E402
from ggbatch.runner.tools.bench import run_engine  # noqa: E402
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question  # noqa: E402

MODES = ("none", "before", "later")
TOKENS = 64


def one_round(model: str, questions: list[Question], threads: int, mode: str, k: int,
              gpu_layers: int) -> dict[str, float]:
    """A fresh engine answers the questions: its time from the first step to the last answer, and
    its counters."""
    from ggbatch.workers.llama.engine import LlamaEngine

    LlamaEngine.logprobs_beside_decode = mode == "later"
    asked: Optional[int] = None if mode == "none" else k
    n_ctx_seq = max(len(q.tokens) for q in questions) + TOKENS + 1
    config = EngineConfig(model_path=model, n_threads=threads, slots=len(questions), n_ctx_seq=n_ctx_seq, n_batch=512,
                          generation=GenerationParams(TOKENS, ignore_eos=True, token_logprobs=asked), kv_unified=False)
    wall, stats = run_engine(config, questions, warm_up=True, gpu_layers=gpu_layers)
    return {"wall_s": wall, **stats}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--k", type=int, default=5, help="alternatives per token")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (the host has every core)")
    ap.add_argument("--gpu-layers", default="0", help="layers on the GPU: N or all (default 0)")
    args = ap.parse_args()
    model = args.model or bench_model()
    questions = load_questions(model, 32, SYSTEM)
    gpu_layers = GPU_ALL if args.gpu_layers == "all" else int(args.gpu_layers)
    walls: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.repeat):
        for mode in MODES:
            got = one_round(model, questions, args.threads, mode, args.k, gpu_layers)
            walls[mode].append(got["wall_s"])
            print(f"round {r + 1} {mode:6}: {got['wall_s']:.3f} s (decode {got['decode_s']:.3f}, picking "
                  f"{got['sample_s']:.3f}, log-probabilities {got['logprob_s']:.3f}, of "
                  f"{got['logprob_tokens']:.0f} tokens {got['logprob_later_tokens']:.0f} during the next decode, "
                  f"waited for {got['logprob_wait_s']:.3f})", flush=True)
    medians = {m: statistics.median(w) for m, w in walls.items()}
    print("medians: " + ", ".join(f"{m} {v:.3f} s ({v / medians['none']:.2f}x none)" for m, v in medians.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
