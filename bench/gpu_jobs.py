"""Whole jobs with every layer on one GPU: bench/compare_server.py's W4 and LSAT workloads,
run by `ggbatch run --gpu-layers all --devices 0`, in the layouts given.

    python bench/gpu_jobs.py [--model M.gguf] [--runs "W4;W4:--slots=255;LSAT"] [--json F]

Runs are separated by `;`; each is a workload name, optionally followed by `:` and extra
`ggbatch run` flags separated by commas (`W4:--slots=255,--n-batch=2048`). For each it prints the wall time of the whole
command, the layout the job chose, generated tokens per second over the workers' busy time, and
where the worker's steps went: llama_decode's call, reading logits and picking tokens (on a GPU
this also waits for the device, since llama_decode returns before the device is done), and the
engine's own Python.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from compare_server import time_ggbatch, workload  # noqa: E402
from engine_bench import bench_model  # noqa: E402

GPU_FLAGS = ["--gpu-layers", "all", "--devices", "0"]


def parse_run(text: str) -> tuple[str, list[str]]:
    name, _, flags = text.partition(":")
    extra = [part for flag in flags.split(",") if flag for part in flag.split("=", 1)]
    return name, extra


def summary(name: str, extra: list[str], wall: float, report: dict[str, Any]) -> dict[str, Any]:
    lay = report["layout"]
    engine: dict[str, float] = {}
    for worker in report.get("workers", {}).values():
        for key, value in worker.get("engine", {}).items():
            engine[key] = engine.get(key, 0.0) + value
    step, decode, pick = engine.get("step_s", 0.0), engine.get("decode_s", 0.0), engine.get("sample_s", 0.0)
    generated = report["tokens"]["generated"]
    return {"run": " ".join([name, *extra]), "wall_s": round(wall, 2),
            "layout": f"{lay['workers']}w x {lay['threads_per_worker']}t x {lay['slots_per_worker']} slots",
            "generated": generated, "prompt_computed": report["prefix_cache"]["prompt_tokens_computed"],
            "gen_tok_per_step_s": round(generated / step, 1) if step else None,
            "steps": engine.get("steps"), "step_s": round(step, 3), "decode_s": round(decode, 3),
            "pick_s": round(pick, 3), "python_s": round(max(0.0, step - decode - pick), 3),
            "timings": report["timings_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--runs", default="W4;W4:--slots=255;LSAT")
    ap.add_argument("--json", help="also write each run's summary and whole report here")
    args = ap.parse_args()
    model = args.model or bench_model()
    out = []
    for text in args.runs.split(";"):
        name, extra = parse_run(text)
        run = time_ggbatch(model, workload(name), GPU_FLAGS + extra)
        row = summary(name, extra, run.wall, run.report)
        print(json.dumps(row), flush=True)
        out.append({"summary": row, "report": run.report})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
