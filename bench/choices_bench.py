"""Fixed choices against one generated token: the whole MMLU validation set (1,542 questions)
answered by `ggbatch run --choices A,B,C,D`, and by the same job with `--max-tokens 1` instead,
in alternating runs, each timed as the whole command (start-up, model load and tokenizing
included). Prints each run's wall time, where its engine spent its steps (llama_decode, sampling:
the choices' log-softmax, the rest: the engine's own Python, the vocabulary pass that finds each
choice's tokens included), and the medians' ratio (the target: within 1.15×).

    python bench/choices_bench.py [--model M.gguf] [--questions 1542] [--repeat 2] [--json F]

The model defaults to the benchmark model (~/.cache/ggbatch/bench-28x1024-q4_k_m.gguf, built from
the Qwen2 vocabulary when absent, as bench/engine_bench.py builds it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from engine_bench import bench_model  # noqa: E402

MMLU = ROOT.parent / "shared" / "data" / "mmlu" / "questions.jsonl"
SYSTEM = "Answer with the letter of the correct choice."
SIDES = {"choices": ["--choices", "A,B,C,D"], "max_tokens_1": ["--max-tokens", "1"]}


def run_job(model: str, questions: Path, side: str, tmp: Path) -> dict[str, Any]:
    """One whole `ggbatch run`: its wall time and what its report says."""
    out, report = tmp / f"{side}.jsonl", tmp / f"{side}.report.json"
    cmd = [sys.executable, "-m", "ggbatch", "run", "--model", model, "--input", str(questions),
           "--output", str(out), "--report", str(report), "--system", SYSTEM, "--fresh", "--progress", "off",
           *SIDES[side]]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"{side}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    rep = json.loads(report.read_text())
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    lay = rep["layout"]
    engine = [w["engine"] for w in rep["workers"].values() if w.get("engine")]
    work = {k: sum(e[k] for e in engine) for k in ("step_s", "decode_s", "sample_s")}
    return {"wall_s": wall, **work, "other_s": work["step_s"] - work["decode_s"] - work["sample_s"],
            "answered": rep["questions"]["answered"], "prompt_tokens": rep["tokens"]["prompt"],
            "layout": f"{lay['workers']}w x {lay['threads_per_worker']}t x {lay['slots_per_worker']} slots, "
                      f"n_ctx {lay['n_ctx_per_sequence']}",
            "letters": sum(a.get("answer") in ("A", "B", "C", "D") for a in answers)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--questions", type=int, default=1542)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = args.model or bench_model()
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        questions = tmp / "mmlu.jsonl"
        lines = MMLU.read_text(encoding="utf-8").splitlines()[:args.questions]
        questions.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for round_ in range(args.repeat):
            order = list(SIDES) if round_ % 2 == 0 else list(reversed(SIDES))  # alternate who goes first
            for side in order:
                got = run_job(model, questions, side, tmp)
                walls[side].append(got["wall_s"])
                print(f"round {round_ + 1} {side:13s} {got['wall_s']:7.1f} s (engine steps {got['step_s']:.1f} s: "
                      f"llama_decode {got['decode_s']:.1f}, sampling {got['sample_s']:.2f}, the rest "
                      f"{got['other_s']:.2f}), answered {got['answered']}, "
                      f"letter answers {got['letters']}, prompt tokens {got['prompt_tokens']}, {got['layout']}",
                      flush=True)
    medians = {side: statistics.median(w) for side, w in walls.items()}
    ratio = medians["choices"] / medians["max_tokens_1"]
    print(f"median: --choices A,B,C,D {medians['choices']:.1f} s, --max-tokens 1 {medians['max_tokens_1']:.1f} s: "
          f"{ratio:.3f}x (target <= 1.15x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"walls_s": walls, "medians_s": medians, "ratio": ratio}, indent=2))
    return 0 if ratio <= 1.15 else 1


if __name__ == "__main__":
    sys.exit(main())
