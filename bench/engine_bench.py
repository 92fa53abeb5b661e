"""Generated tokens per second of one worker's engine at several slot counts, and how much of each
step is the engine's own Python work (the rest is llama_decode and llama.cpp's samplers).

    python bench/engine_bench.py [--model M.gguf] [--slots 1,4,8,16] [--tokens 64]

Without --model it builds (once, cached) the project's realistic-shape benchmark model: 28 layers
× 1024 hidden, 16 heads, 8 KV heads, FFN 3072, Q4_K_M, random weights, with the qwen2 tokenizer
and chat template copied from ../shared/models/ggml-vocab-qwen2.gguf.

The KV layout is the one a job would pick (runner.layout.kv_unified_for). Each run answers
`slots` GSM8K questions (chat template, system prompt "Answer the question
concisely.") with exactly --tokens generated tokens each (ignore_eos), greedy, and reports, like
llama-batched-bench: S_TG, generated tok/s over the steps that only generate (one token per
sequence), and over the whole run with prompt processing (wall). Targets: slots 8 >= 1.8 ×
slots 1 in generated tok/s, Python work < 5% of step time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from ggbatch.runner.config.checks import bool_or_auto  # noqa: E402
from ggbatch.runner.files.paths import ggbatch_cache  # noqa: E402
from ggbatch.runner.plan.layout import usable_cores  # noqa: E402
from ggbatch.runner.plan.repack import cpu_flags, repack_weights  # noqa: E402
from ggbatch.runner.questions.prepare import common_prefix  # noqa: E402
from ggbatch.runner.questions.prompts import PromptBuilder  # noqa: E402
from ggbatch.runner.tools.bench import engine_config, run_engine  # noqa: E402
from ggbatch.workers.protocol import Question  # noqa: E402

SHARED = ROOT.parent / "shared"
QWEN2_VOCAB = SHARED / "models" / "ggml-vocab-qwen2.gguf"
GSM8K = SHARED / "data" / "gsm8k" / "questions.jsonl"


def bench_model() -> str:
    """The realistic-shape benchmark model, built once into the user's cache."""
    from ggbatch.runner.model.make import modelgen
    cache = ggbatch_cache()
    path = cache / "bench-28x1024-q4_k_m.gguf"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"building {path} (about a minute and a half) ...", file=sys.stderr)
        modelgen.make_model(path, "bench-28x1024", vocab=str(QWEN2_VOCAB), quant="q4_k_m")
    return str(path)


def load_questions(model: str, n: int, system: str, path: Path = GSM8K) -> list[Question]:
    """The first n questions of a question file (GSM8K's by default), rendered with the model's
    chat template and tokenized."""
    from ggbatch.workers.llama.model_runner import Tokenizer

    tok = Tokenizer(model)
    builder = PromptBuilder(tok.chat_template, system=system, bos_token=tok.bos_text, eos_token=tok.eos_text)
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for _, line in zip(range(n), f)]
    out = []
    for r in records:
        text = builder.render(r["question"])
        out.append(Question(r["questionID"], tok.tokenize(text, add_bos=builder.needs_bos(text)), 0))
    tok.close()
    return out


def run_once(model: str, questions: list[Question], slots: int, threads: int, tokens: int,
             repack: bool) -> dict[str, Any]:
    prefix = common_prefix([q.tokens for q in questions])
    n_ctx_seq = max(len(q.tokens) for q in questions) + tokens + 1
    wall, st = run_engine(engine_config(model, threads, slots, n_ctx_seq, prefix, tokens, repack), questions,
                          warm_up=False)
    python_s = st["step_s"] - st["decode_s"] - st["sample_s"]
    return {"slots": slots, "questions": len(questions), "wall_s": wall,
            "gen_tok_s": st["generated_tokens"] / wall, "s_tg": st["tg_tokens"] / st["tg_steps_s"],
            "decode_share": st["decode_s"] / st["step_s"],
            "sample_share": st["sample_s"] / st["step_s"], "python_share": python_s / st["step_s"],
            "python_ms_per_step": 1000 * python_s / st["steps"], "steps": st["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--slots", default="1,4,8,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=len(usable_cores()))
    ap.add_argument("--system", default="Answer the question concisely.")
    ap.add_argument("--questions", type=int, help="questions per run (default: as many as slots)")
    ap.add_argument("--repack", choices=["auto", "true", "false"], default="auto",
                    help="weights in llama.cpp's repacked layout (auto: as a job decides by CPU)")
    args = ap.parse_args()
    requested = bool_or_auto(args.repack)
    model = args.model or bench_model()
    slot_list = [int(s) for s in args.slots.split(",")]
    questions = load_questions(model, args.questions or max(slot_list), args.system)
    print(f"model {model}, {args.threads} threads, {args.tokens} generated tokens per question, weights "
          f"repacked or not as a job with that many slots would ({args.repack})")
    print(f"{'slots':>5} {'S_TG tok/s':>10} {'vs 1':>5} {'wall s':>7} {'wall gen tok/s':>14} "
          f"{'decode%':>7} {'sample%':>7} {'python%':>7} {'py ms/step':>10} {'repacked':>8}")
    base = None
    for slots in slot_list:
        repack = repack_weights(requested, None, cpu_flags(), slots)[0]
        r = run_once(model, questions[:args.questions or slots], slots, args.threads, args.tokens, repack)
        base = base or r["s_tg"]
        print(f"{slots:>5} {r['s_tg']:>10.1f} {r['s_tg'] / base:>5.2f} {r['wall_s']:>7.2f} "
              f"{r['gen_tok_s']:>14.1f} {100 * r['decode_share']:>7.1f} {100 * r['sample_share']:>7.1f} "
              f"{100 * r['python_share']:>7.2f} {r['python_ms_per_step']:>10.2f} {str(repack):>8}", flush=True)


if __name__ == "__main__":
    main()
