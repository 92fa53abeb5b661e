"""Log-likelihood scoring: ggbatch's engine against llama-cpp-python on the same (context,
continuation) pairs, in one sitting: the largest difference of any log-likelihood (nats), whether
is_greedy ever differs, the prompt tokens each computed, and the time each took.

    python bench/loglik_bench.py --model M.gguf --contexts 100 --per-context 4 --slots 16

The pairs: MMLU-style contexts (a passage of words and a question) each with several short
continuations, tokenized as lm-eval does (context and continuation together, split at the context's
length). llama-cpp-python evaluates each context once with `logits_all` on and reads every
continuation's rows after it (one request at a time, the reference the issue names); ggbatch scores
them all through one LlamaEngine with the prefix cache.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from array import array
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
Pairs = list[tuple[list[int], list[int]]]  # (context tokens, continuation tokens)
WORDS = "the a cat dog ran sat big small red blue tree house little girl boy happy sad".split()


def pairs_for(tokenize: Callable[[str], Sequence[int]], n_contexts: int, per_context: int, seed: int = 1) -> Pairs:
    rng = random.Random(seed)
    out = []
    for _ in range(n_contexts):
        context = " ".join(rng.choice(WORDS) for _ in range(120)) + "\nQuestion: what happened?\nAnswer:"
        for _ in range(per_context):
            cont = " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
            whole, ctx = tokenize(context + cont), tokenize(context)
            out.append((list(ctx), list(whole[len(ctx):])))
    return out


def reference(model: str, pairs: Pairs, n_ctx: int) -> tuple[list[tuple[list[float], bool]], float]:
    from llama_cpp import Llama

    from ggbatch.workers.engine.loglik import token_scores

    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=512, logits_all=True, verbose=False)
    t0 = time.perf_counter()
    out = []
    for ctx, cont in pairs:
        llm.reset()
        llm.eval(ctx + cont)
        rows = np.array(llm.scores[len(ctx) - 1:len(ctx) + len(cont) - 1])
        logprobs, greedy = token_scores(rows, np.array(cont))
        out.append((logprobs.tolist(), bool(greedy.all())))
    took = time.perf_counter() - t0
    llm.close()
    return out, took


def ggbatch_scores(model: str, pairs: Pairs, slots: int, threads: int,
                   n_ctx: int) -> tuple[list[Any], float, dict[str, float]]:
    from ggbatch.workers.llama.engine import LlamaEngine
    from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
    from helpers import answers_of

    contexts: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, _) in enumerate(pairs):
        contexts.setdefault(tuple(ctx), []).append(i)
    qs = [Question(f"c{k}", array("i", ctx), 0, continuations=tuple(array("i", pairs[i][1]) for i in idx))
          for k, (ctx, idx) in enumerate(contexts.items())]
    engine = LlamaEngine(EngineConfig(model_path=model, n_threads=threads, slots=slots, n_ctx_seq=n_ctx, n_batch=512,
                                      generation=GenerationParams(max_tokens=1),
                                      kv_unified=False, flash_attn=False, prefix_cache=True), worker_id=0)
    t0 = time.perf_counter()
    got = answers_of(engine, qs)
    took = time.perf_counter() - t0
    stats = engine.stats()
    engine.close()
    out: list[Any] = [None] * len(pairs)
    for k, idx in enumerate(contexts.values()):
        scored = got[f"c{k}"].scored
        assert scored is not None, f"c{k} has no scores"
        for j, i in enumerate(idx):
            out[i] = scored[j]
    return out, took, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", type=int, default=100)
    ap.add_argument("--per-context", type=int, default=4)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from ggbatch.workers.llama.model_runner import Tokenizer

    tok = Tokenizer(args.model)
    pairs = pairs_for(tok.tokenize, args.contexts, args.per_context)
    tok.close()
    n_ctx = max(len(c) + len(x) for c, x in pairs) + 8
    want, t_ref = reference(args.model, pairs, n_ctx)
    got, t_gg, stats = ggbatch_scores(args.model, pairs, args.slots, args.threads, n_ctx)
    worst = max(abs(s.logprob - sum(w)) for s, (w, _) in zip(got, want))
    greedy_diff = sum(s.is_greedy != g for s, (_, g) in zip(got, want))
    print(f"{len(pairs)} pairs on {len(set(tuple(c) for c, _ in pairs))} contexts, model {Path(args.model).name}")
    print(f"largest log-likelihood difference: {worst:.2e} nats; is_greedy differs on {greedy_diff}")
    print(f"llama-cpp-python, one request at a time: {t_ref:.2f} s, "
          f"{sum(len(c) + len(x) for c, x in pairs)} prompt tokens computed")
    print(f"ggbatch engine, {args.slots} slots: {t_gg:.2f} s, {int(stats['prompt_computed'])} prompt tokens "
          f"computed ({t_ref / t_gg:.1f}x)")


if __name__ == "__main__":
    main()
