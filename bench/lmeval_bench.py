"""lm-eval through ggbatch's backend (ggbatch.lm_eval.GgbatchLM) on local tasks, timed: the model
loaded once, then each task's requests answered through one warm pool. Prints each task's metrics,
the wall time, and the prompt tokens the workers computed against the tokens the requests hold.

    HF_DATASETS_OFFLINE=1 python bench/lmeval_bench.py --model M.gguf --include-path tasks/ \\
        --tasks mmlu_val_local --num-fewshot 5 --limit 100 --workers 2

Peers for the issue's comparison (lm-eval's `gguf` and `local-completions` backends against
llama-cpp-python's server) run their own lm_eval command lines on the same task files.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", required=True, help="comma-separated task names")
    ap.add_argument("--include-path", required=True, help="the folder of the task YAMLs (dataset_path: json)")
    ap.add_argument("--num-fewshot", type=int, default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    import lm_eval
    from lm_eval.tasks import TaskManager

    from ggbatch.lm_eval import GgbatchLM

    settings = {k: v for k, v in (("workers", args.workers), ("threads", args.threads)) if v is not None}
    t0 = time.perf_counter()
    lm = GgbatchLM(model=args.model, **settings)  # the pool starts while lm-eval builds the tasks
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=args.tasks.split(","), num_fewshot=args.num_fewshot,
                                      limit=args.limit, task_manager=TaskManager(include_path=args.include_path))
        took = time.perf_counter() - t0
        stats = lm.pool.stats()
    finally:
        lm.pool.close()
    for task, metrics in out["results"].items():
        print(task, json.dumps({k: v for k, v in metrics.items() if isinstance(v, float)}, default=float))
    print(f"ggbatch backend: {took:.1f} s in all, the pool's start included")
    print("pool counters:", json.dumps({k: v for k, v in stats.items() if "token" in k}, default=str))


if __name__ == "__main__":
    main()
