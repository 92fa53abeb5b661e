"""pool.stats(): the counters a job's report has, for a warm pool so far: answers given, tokens and
rates from the engines' counters (runner/pool/pool.py engine_counters), each worker's memory
(PSS, runner/watch/monitor.py), restarts, load time and engine time."""

from __future__ import annotations

import time
from typing import Any

from ..pool.pool import WorkerPool
from ..pool.worker_run import WorkerRun
from ..watch.watch import RunWatch
from .calls import Calls


def pool_stats(workers: WorkerPool, watch: RunWatch, calls: Calls, started: float, slots: int) -> dict[str, Any]:
    elapsed = max(time.perf_counter() - started, 1e-9)
    counters = workers.engine_counters()
    generated = sum(c.generated_tokens for c in counters.values())
    prompt = sum(c.prompt_tokens for c in counters.values())
    usage = watch.monitor.workers
    answering = calls.answering_s
    return {
        # the answers the calls gave back, one per question asked (an identical prompt's too), as
        # a job's report counts records: without an error, with one
        "answered": calls.answered, "failed": calls.failed,
        # what the engines decoded: a prefix the cache held, or a sample's copied prompt, is not counted
        "generated_tokens": generated, "prompt_tokens_computed": prompt,
        "steps": sum(c.steps for c in counters.values()),
        "busy_slots": sum(c.busy_slots for c in counters.values()),
        # sequences decoded together, over every worker, now: a warm pool's grow with its calls (runner/plan/growth.py)
        "slots": slots,
        # per second answering (a call's question at the workers): the pool's idle time left out
        "elapsed_s": round(elapsed, 3), "answering_s": round(answering, 3),
        "generated_tokens_per_s": round(generated / answering, 2) if answering > 0 else 0.0,
        # each change of a worker's llama.cpp threads (threads_adapt), as a job's report lists them
        "thread_changes": list(watch.thread_changes),
        "workers": {run.worker_id: {"restarts": run.restarts, "contexts": run.contexts,
                                    "pss_mib": round(usage[run.worker_id].pss / 2**20, 1)
                                    if run.worker_id in usage else None,
                                    "peak_pss_mib": round(usage[run.worker_id].peak_pss / 2**20, 1)
                                    if run.worker_id in usage else None,
                                    **_times(run)}
                    for run in workers.worker_runs()},
    }


def _times(run: WorkerRun) -> dict[str, Any]:
    """Where a worker's time went: from its spawn to ready in its last life (the model's load and
    the context's), then the engine's steps over all its lives, of them llama_decode and picking tokens. On a GPU
    the model's work can be small beside the rest: these say how small."""
    return {"load_s": None if run.load_s is None else round(run.load_s, 3),
            **{f"engine_{part}_s": round(run.engine.get(f"{part}_s", 0.0), 3) for part in ("step", "decode", "sample")}}
