"""The prefix cache's engine alone (no coordinator, no processes) on the LSAT-RC questions: one
worker's engine laid out as a job's would be, the questions added in the coordinator's grouped
order, timed from the first step to the last answer, with the prompt and generation steps apart.
A quick loop for tuning the prefill layout; bench/prefix_bench.py times the whole command.

    python bench/prefix_engine_bench.py [--questions 64] [--variants cache,off] [--repeat 1]

A variant is `cache` or `off` (the prefix cache), with `+nofa` (flash attention off) or
`+fa` (on), `+b<N>` (the step's token budget n_batch; without it, as a job would choose it:
runner/plan/layout.py batch_budget) and `+byid` (prompt steps listed by sequence id, as before
workers/engine/ubatches.py) appended as wanted: e.g. cache+nofa+b512.
Without `+fa`/`+nofa` flash attention is as a job would choose it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from compare_server import LSAT  # noqa: E402
from engine_bench import bench_model, load_questions  # noqa: E402
from ggbatch.runner.plan import layout as layouts  # noqa: E402
from ggbatch.runner.plan.layout import Layout, usable_cores  # noqa: E402
from ggbatch.runner.plan.repack import cpu_flags, repack_weights  # noqa: E402
from ggbatch.runner.questions.prefix_groups import grouped_order  # noqa: E402
from ggbatch.runner.questions.prepare import common_prefix  # noqa: E402
from ggbatch.workers.engine.invariant import step_budget  # noqa: E402
from ggbatch.workers.protocol import GenerationParams, Question  # noqa: E402

SYSTEM = "Answer with the letter of the correct choice."
TOKENS = 32


def lsat_questions(model: str, n: int) -> list[Question]:
    return load_questions(model, n, SYSTEM, LSAT)


def run(model: str, questions: list[Question], variant: str, threads: int) -> dict[str, Any]:
    from ggbatch.workers.llama.engine import LlamaEngine

    parts = variant.split("+")
    cache = parts[0] == "cache"
    prefix = common_prefix([q.tokens for q in questions])
    order, _ = grouped_order([q.tokens for q in questions], len(prefix))
    ordered = ([replace(questions[i], group=g) for i, g in order] if cache else
               sorted(questions, key=lambda q: len(q.tokens), reverse=True))
    slots = min(64, len(questions))
    asked = next((int(p[1:]) for p in parts if p[:1] == "b" and p[1:].isdigit()), None)
    n_batch = layouts.batch_budget(asked, cache, False)  # as a job would choose it, unless asked
    n_ctx_seq = max(len(q.tokens) for q in questions) + TOKENS + 1
    repack = repack_weights(None, None, cpu_flags(), slots)[0]
    unified = layouts.kv_unified_for(len(prefix), n_ctx_seq, False, cache)
    lay = Layout(1, threads, slots, (), repack, "bench", n_ctx_seq, unified, step_budget(n_batch, slots, False),
                 prefix_cache=cache)
    config = layouts.engine_config(model, lay, prefix, GenerationParams(max_tokens=TOKENS, ignore_eos=True))
    if "nofa" in parts or "fa" in parts:
        config = replace(config, flash_attn="fa" in parts)
    engine = LlamaEngine(config, worker_id=0)
    engine.sched.shaped_prefill = "byid" not in parts  # this engine's alone
    try:
        for q in ordered:
            engine.add(q)
        t0, c0 = time.perf_counter(), time.process_time()
        pp_s = 0.0
        while engine.n_unfinished:
            before = engine.counters.tg_steps_s
            s0 = time.perf_counter()
            engine.step()
            if engine.counters.tg_steps_s == before:
                pp_s += time.perf_counter() - s0
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        st = engine.stats()
    finally:
        engine.close()
    return {"variant": variant, "wall": wall, "cpu": cpu, "pp_s": pp_s, "tg_s": st["tg_steps_s"],
            "computed": int(st["prompt_computed"]), "steps": int(st["steps"]),
            "flash_attn": config.flash_attn, "n_batch": config.n_batch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--variants", default="cache,off")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=len(usable_cores()))
    args = ap.parse_args()
    model = args.model or bench_model()
    questions = lsat_questions(model, args.questions)
    walls: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for variant in args.variants.split(","):
            r = run(model, questions, variant, args.threads)
            walls.setdefault(variant, []).append(r["wall"])
            print(f"{variant:>20}: {r['wall']:6.1f} s, CPU {r['cpu']:6.1f} s (prompt steps {r['pp_s']:5.1f} s, "
                  f"generation steps {r['tg_s']:5.1f} s), prompt tokens computed {r['computed']}, {r['steps']} steps, "
                  f"flash_attn {r['flash_attn']}, n_batch {r['n_batch']}", flush=True)
    for variant, w in walls.items():
        print(f"{variant}: median {statistics.median(w):.1f} s of {len(w)}")


if __name__ == "__main__":
    main()
