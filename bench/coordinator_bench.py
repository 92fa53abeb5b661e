"""W3: the coordinator alone. N questions answered by the fake engine (tests/fake_engine.py, the
real engine interface, no model), through the whole runner: read, render, tokenize, dispatch,
merge, write, report. Prints questions/s of the dispatch phase (first worker ready to last
answer) and of the whole job, and the coordinator's peak memory, for several N so that memory
growth with the question count shows.

    python bench/coordinator_bench.py [--questions 2000,20000] [--workers 2] [--model M.gguf]
    python bench/coordinator_bench.py --input ../shared/data/gsm8k/questions.jsonl   # a real file

The model is only tokenized with (a vocab-only GGUF will do): its vocabulary and chat template
decide what preparing the questions costs.

Target: >= 20,000 questions/s in the dispatch phase, coordinator memory that does not grow with
the question count beyond the answers themselves.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_MODEL = ROOT.parent / "shared" / "models" / "stories260K.gguf"  # for tokenizing only


def write_questions(path: Path, n: int, source: Optional[str]) -> int:
    """n synthetic questions, or those of `source` (all of them when n is 0); returns the count."""
    with open(path, "w") as f:
        if source is None:
            for i in range(n):
                f.write(json.dumps({"questionID": f"q{i}", "question": f"What is {i} plus {i % 97}?"}) + "\n")
            return n
        with open(source, encoding="utf-8") as src:
            records = [json.loads(line) for line in src if line.strip()]
        for r in records[:n or None]:
            f.write(json.dumps({"questionID": r["questionID"], "question": r["question"]}) + "\n")
        return len(records[:n or None])


def one_run(n: int, workers: int, model: str, source: Optional[str]) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from fake_engine import Fake
    from ggbatch import build_config
    from ggbatch.runner.job import run_job

    with tempfile.TemporaryDirectory() as tmp:
        questions = Path(tmp) / "q.jsonl"
        n = write_questions(questions, n, source)
        config = build_config([("bench", {"model": model, "input": str(questions),
                                          "output": str(Path(tmp) / "a.jsonl"), "workers": workers,
                                          "slots": 64, "max_tokens": 8})])
        t0 = time.perf_counter()
        report = run_job(config, engine_factory=Fake(), progress="log")
        total = time.perf_counter() - t0
    t = report.as_json()["timings_s"]
    dispatch_s = t["total_s"] - t["first_worker_ready_s"]
    return {"questions": n, "total_s": round(total, 3), "prepare_s": t["prepare_s"],
            "dispatch_s": round(dispatch_s, 3), "dispatch_q_per_s": round(n / dispatch_s),
            "job_q_per_s": round(n / total), "coordinator_peak_rss_mib":
            round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default="2000,20000")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default=str(TOKENIZER_MODEL), help="GGUF to tokenize with (default stories260K)")
    ap.add_argument("--input", help="a question file to use instead of synthetic questions "
                                    "(--questions then caps the count; 0 = all)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one run in this process
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.workers, args.model, args.input)))
        return
    if args.input and args.questions == ap.get_default("questions"):
        args.questions = "0"
    print(f"{'questions':>9} {'total s':>8} {'prepare s':>9} {'dispatch s':>10} {'dispatch q/s':>12} "
          f"{'job q/s':>8} {'coord. peak RSS MiB':>19}")
    for n in (int(x) for x in args.questions.split(",")):
        # A fresh process per size, so peak memory is that run's own.
        extra = ["--model", args.model] + (["--input", args.input] if args.input else [])
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--workers", str(args.workers), *extra],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['questions']:>9} {r['total_s']:>8.2f} {r['prepare_s']:>9.2f} {r['dispatch_s']:>10.3f} "
              f"{r['dispatch_q_per_s']:>12} {r['job_q_per_s']:>8} {r['coordinator_peak_rss_mib']:>19.1f}")


if __name__ == "__main__":
    main()
