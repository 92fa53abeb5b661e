"""Prefill speed per token: llama-cpp-python computing one context at a time (logits_all off, the
lm-eval peer of bench/llamacpp_lm.py) against ggbatch's engine scoring the same contexts, which
share nothing, so both compute every token.

    python bench/prefill_parity_bench.py [--model M.gguf] [--contexts 24] [--tokens 273]

Contexts of random words cut to --tokens tokens, each with four one-token continuations on
ggbatch's side (as lm-eval's MMLU letters). ggbatch runs with 1 slot (repacked weights and
plain; repacked only where llama.cpp's repacked kernels run here: bench/plain_weights.py) and
16 slots (plain); the peer runs first and last, so a drift of the machine shows.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from array import array
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
WORDS = "the a cat dog ran sat big small red blue tree house little girl boy happy sad".split()


def contexts(tokenize: Callable[[str], Sequence[int]], n: int, tokens: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(tokenize(" ".join(rng.choice(WORDS) for _ in range(tokens)) + "\nAnswer:"))[:tokens]
            for _ in range(n)]


def peer(model: str, ctxs: list[list[int]], threads: int) -> float:
    from llama_cpp import Llama

    from plain_weights import follow_plan

    follow_plan()
    llm = Llama(model_path=model, n_ctx=1024, n_batch=512, logits_all=False, n_threads=threads, flash_attn=False,
                verbose=False)
    t0 = time.perf_counter()
    for ctx in ctxs:
        llm.reset()
        llm.eval(ctx)
    took = time.perf_counter() - t0
    llm.close()
    return took


def ggbatch_engine(model: str, ctxs: list[list[int]], threads: int, slots: int,
                   repack: bool) -> tuple[float, dict[str, Any]]:
    from ggbatch.workers.llama.engine import LlamaEngine
    from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
    from helpers import answers_of

    letters = tuple(array("i", [t]) for t in (362, 425, 356, 422))
    qs = [Question(f"c{k}", array("i", ctx), 0, continuations=letters) for k, ctx in enumerate(ctxs)]
    engine = LlamaEngine(EngineConfig(model_path=model, n_threads=threads, slots=slots, n_ctx_seq=1024, n_batch=512,
                                      generation=GenerationParams(max_tokens=1),
                                      kv_unified=False, flash_attn=False, prefix_cache=True, repack=repack), 0)
    t0 = time.perf_counter()
    answers_of(engine, qs)
    took = time.perf_counter() - t0
    stats = engine.stats()
    engine.close()
    return took, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--contexts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=273)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from engine_bench import bench_model
    from ggbatch.workers.llama.model_runner import Tokenizer

    model = args.model or bench_model()
    tok = Tokenizer(model)
    ctxs = contexts(tok.tokenize, args.contexts, args.tokens)
    tok.close()
    n = sum(map(len, ctxs))
    took = peer(model, ctxs, args.threads)
    print(f"llama-cpp-python: {took:.1f} s, {n / took:.1f} tokens/s", flush=True)
    from ggbatch.runner.plan.repack_check import repack_refused

    shapes = ((1, False), (16, False)) if repack_refused() else ((1, True), (1, False), (16, False))
    for slots, repack in shapes:
        took, st = ggbatch_engine(model, ctxs, args.threads, slots, repack)
        print(f"ggbatch engine, {slots} slot(s), {'repacked' if repack else 'plain'}: {took:.1f} s, "
              f"{st['prompt_computed'] / took:.1f} tokens/s ({int(st['prompt_computed'])} computed)", flush=True)
    took = peer(model, ctxs, args.threads)
    print(f"llama-cpp-python again: {took:.1f} s, {n / took:.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
