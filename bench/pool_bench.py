"""A warm pool against ggbatch.answer (issue 27's numbers), on GSM8K questions, greedy, EOS ignored:

  sequential: N one-question calls of T tokens, one after another, on a warm ggbatch.Pool, against N
              ggbatch.answer calls (each starts its workers and loads the model);
  threads:    N threads each pool.submit of one question at once, against one pool.answer of the N;
  idle:       the coordinator's CPU time while a warm pool waits 10 s for a call, and the median of
              10 one-question calls of one token on it (what a call pays beyond the model's work);
  slots:      a warm pool with auto slots (16 a worker at first, grown by its first large call) against
              one with every slot from the start (start_small=False): the start, the idle workers'
              memory, and a first call of N questions of T tokens (the growth's restart included),
              alternated, medians.

    python bench/pool_bench.py                       # the benchmark model, 16 calls of 16 tokens; 32 × 64
    python bench/pool_bench.py --model demo --calls 4 --threads 8 --tokens 8 --thread-tokens 8   # a quick check
    python bench/pool_bench.py --model demo --only idle
    python bench/pool_bench.py --only slots --threads 64 --thread-tokens 32

The model defaults to the benchmark model (~/.cache/ggbatch/bench-28x1024-q4_k_m.gguf, built from
../shared's qwen2 vocabulary on first use, as bench/engine_bench.py does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ggbatch  # noqa: E402
from engine_bench import GSM8K, bench_model  # noqa: E402

# A question none of the measured ones starts with: a pool keeps the prompts it answered, so
# warming up on a measured one would make its later call cheaper.
WARM_UP = "Warm up: what is one and one?"


def questions(n: int) -> list[str]:
    with open(GSM8K, encoding="utf-8") as f:
        return [json.loads(line)["question"] for _, line in zip(range(n), f)]


def sequential(model: str, qs: list[str], tokens: int) -> dict[str, float]:
    settings: dict[str, Any] = {"model": model, "max_tokens": tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    for q in qs:
        ggbatch.answer([q], **settings)
    cold = time.perf_counter() - t0
    with ggbatch.Pool(**settings) as pool:
        pool.answer([WARM_UP])  # the first call's prompt steps are not the pool's start-up
        t0 = time.perf_counter()
        for q in qs:
            pool.answer([q])
        warm = time.perf_counter() - t0
    return {"answer_calls_s": round(cold, 3), "warm_pool_s": round(warm, 3), "speedup": round(cold / warm, 2)}


def threaded(model: str, qs: list[str], tokens: int, repeat: int = 2) -> dict[str, Any]:
    """N threads each submitting one question against one call of the N, each on a pool of its own
    (a pool that has answered the questions once keeps their prompts' KV: the second would be
    cheaper), alternated, the medians kept. Every slot from the start: the growth a first large
    call brings is the `slots` measure's."""
    one_call: list[float] = []
    threads: list[float] = []
    for _ in range(repeat):
        for side in (one_call, threads):
            with ggbatch.Pool(model=model, max_tokens=tokens, ignore_eos=True, start_small=False) as pool:
                pool.answer([WARM_UP])
                t0 = time.perf_counter()
                if side is one_call:
                    pool.answer(qs)
                else:
                    with ThreadPoolExecutor(len(qs)) as ex:
                        list(ex.map(lambda q: pool.submit(q).result(), qs))
                side.append(time.perf_counter() - t0)
    a, b = statistics.median(one_call), statistics.median(threads)
    return {"one_call_s": round(a, 3), "threads_s": round(b, 3), "ratio": round(b / a, 3),
            "runs": {"one_call_s": [round(x, 2) for x in one_call], "threads_s": [round(x, 2) for x in threads]}}


def idle(model: str, seconds: float = 10.0, calls: int = 10) -> dict[str, float]:
    import psutil

    me = psutil.Process()
    with ggbatch.Pool(model=model, max_tokens=1) as pool:
        pool.answer([WARM_UP])
        before = me.cpu_times()
        time.sleep(seconds)
        after = me.cpu_times()
        took = []
        for i in range(calls):
            t0 = time.perf_counter()
            pool.answer([f"Question {i}?"])
            took.append(time.perf_counter() - t0)
    cpu = after.user + after.system - before.user - before.system
    return {"idle_s": seconds, "coordinator_cpu_s": round(cpu, 3),
            "one_question_call_ms": round(1000 * statistics.median(took), 1)}


def slots(model: str, qs: list[str], tokens: int, repeat: int = 2) -> dict[str, object]:
    runs: dict[str, list[tuple[float, float, float]]] = {"small_first": [], "every_slot_first": []}
    for _ in range(repeat):
        sides: tuple[tuple[str, dict[str, Any]], ...] = (("small_first", {}),
                                                          ("every_slot_first", {"start_small": False}))
        for side, settings in sides:
            t0 = time.perf_counter()
            with ggbatch.Pool(model=model, max_tokens=tokens, ignore_eos=True, **settings) as pool:
                started = time.perf_counter() - t0
                pool.answer([WARM_UP])
                pss = sum(w["pss_mib"] or 0 for w in pool.stats()["workers"].values())
                t1 = time.perf_counter()
                pool.answer(qs)
                runs[side].append((started, pss, time.perf_counter() - t1))
    return {side: {"start_s": round(statistics.median(r[0] for r in rs), 2),
                   "idle_pss_mib": round(statistics.median(r[1] for r in rs)),
                   "first_call_s": round(statistics.median(r[2] for r in rs), 2),
                   "runs": [[round(x, 2) for x in r] for r in rs]} for side, rs in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF or demo (default: the benchmark model)")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--thread-tokens", type=int, default=64)
    ap.add_argument("--only", choices=("sequential", "threads", "idle", "slots"), help="one measure (default: all)")
    args = ap.parse_args()
    model = args.model or bench_model()
    measures: dict[str, Callable[[], Any]] = {
        "sequential": lambda: sequential(model, questions(args.calls), args.tokens),
        "threads": lambda: threaded(model, questions(args.threads), args.thread_tokens),
        "idle": lambda: idle(model),
        "slots": lambda: slots(model, questions(args.threads), args.thread_tokens)}
    print(json.dumps({name: measure() for name, measure in measures.items() if args.only in (None, name)}, indent=1))


if __name__ == "__main__":
    main()
