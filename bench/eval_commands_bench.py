"""The user's whole command, `ggbatch eval`, against lm-eval's own command line with ggbatch's
model registered, on the same local tasks as bench/lmeval_compare.py, in one sitting, the two
sides alternated; medians.

    HF_DATASETS_OFFLINE=1 python bench/eval_commands_bench.py [--model M.gguf] [--task mmlu|gsm8k|both]
        [--mmlu 100] [--gsm8k 32] [--repeat 2] [--gpu-layers all]

Both sides run the same backend on the same task, and index every task lm-eval ships, as a
user's run does; the gap is lm-eval's own work that `ggbatch eval` cuts (its task index kept,
its templates compiled once: docs/guide/evaluation.md). Each side runs once untimed first, on one
question, so that `ggbatch eval`'s index is kept and the files are in the page cache. The model
defaults to the benchmark model; the proxy (`ggbatch make-model --shape demo --vocab
../shared/models/ggml-vocab-qwen2.gguf proxy.gguf`) makes the model's work small, as on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from engine_bench import bench_model  # noqa: E402
from lmeval_compare import SHOTS, alternate, task_options, write_tasks  # noqa: E402

LM_EVAL_CLI = "import ggbatch.lm_eval; from lm_eval.__main__ import cli_evaluate; cli_evaluate()"


def commands(model: str, task: str, folder: Path, settings: dict[str, Any]) -> dict[str, list[str]]:
    """Each side's command line for the task."""
    common = ["--tasks", task, "--include_path", str(folder), "--num_fewshot", str(SHOTS), "--device", "cpu"]
    args = ["--model_args", json.dumps(settings)] if settings else []
    return {"ggbatch eval": [sys.executable, "-m", "ggbatch", "eval", "--model", model, *args, *common],
            "lm-eval's command line": [sys.executable, "-c", LM_EVAL_CLI, "--model", "ggbatch",
                                       "--model_args", json.dumps({"pretrained": model, **settings}), *common]}


def timed(name: str, command: list[str], task: str) -> Callable[[], float]:
    def run() -> float:
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        took = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr[-2000:]}")
        metric = [line for line in done.stdout.splitlines() if line.startswith(f"|{task}")]
        print(f"{task} {name}: {took:.2f} s {metric}", flush=True)
        return took
    return run


def run_task(model: str, task: str, folder: Path, rounds: int, settings: dict[str, Any]) -> None:
    sides = commands(model, task, folder, settings)
    for command in sides.values():  # untimed, one question
        subprocess.run([*command, "--limit", "1"], capture_output=True, timeout=1800, check=True)
    ours, theirs = (timed(name, command, task) for name, command in sides.items())
    alternate(rounds, ours, theirs, f"{task} commands")


def main() -> None:
    ap = task_options(__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-layers", default="0", help="layers on the GPU on both sides: N or all (default 0)")
    args = ap.parse_args()
    settings = {"model.n_gpu_layers": args.gpu_layers} if args.gpu_layers != "0" else {}
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    model = args.model or bench_model()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_tasks(folder, args)
        for name, task in (("mmlu", "mmlu_val_local"), ("gsm8k", "gsm8k_local")):
            if args.task in (name, "both"):
                run_task(model, task, folder, args.repeat, settings)


if __name__ == "__main__":
    main()
