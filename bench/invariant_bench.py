"""Batch invariance and its cost: the engine on GSM8K prompts rendered as a job renders them, at
several slot counts, in up to three layouts, printing the wall time of each run and how many
answers differ from the first slot count's.

    python bench/invariant_bench.py --model M.gguf [--questions 64] [--max-tokens 256]
        [--slots 1,16] [--layouts default,streams,invariant] [--threads 1] [--repeat 1]

Layouts: `default`, one KV stream per sequence with flash attention (a job's usual layout);
`streams`, the same without flash attention (what batch_invariant was before its batches were
laid out by workers/engine/invariant.py); `invariant`, batch_invariant as it is. Runs of one slot count
alternate between the layouts, so a slow spell on a shared machine hits them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from ggbatch.runner.questions.prepare import common_prefix  # noqa: E402
from ggbatch.runner.questions.prompts import PLAIN_STOP, PromptBuilder  # noqa: E402
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question  # noqa: E402

GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "questions.jsonl"
LAYOUTS = {"default": {"flash_attn": True}, "streams": {"flash_attn": False},
           "invariant": {"flash_attn": False, "batch_invariant": True}}


def load_questions(model: str, n: int) -> tuple[list[Question], bool]:
    """The first n GSM8K questions with the model's chat template (else the plain one), longest
    first as a job orders them; and whether the prompts are plain (then answers stop at PLAIN_STOP)."""
    from ggbatch.workers.llama.model_runner import Tokenizer

    tok = Tokenizer(model)
    builder = PromptBuilder(tok.chat_template, bos_token=tok.bos_text, eos_token=tok.eos_text)
    with open(GSM8K, encoding="utf-8") as f:
        records = [json.loads(line) for _, line in zip(range(n), f)]
    questions = []
    for r in records:
        text = builder.render(r["question"])
        questions.append(Question(r["questionID"], tok.tokenize(text, add_bos=builder.needs_bos(text)), 0))
    tok.close()
    questions.sort(key=lambda q: len(q.tokens), reverse=True)
    return questions, builder.is_plain


def run(model: str, questions: list[Question], slots: int, layout: str, threads: int, max_tokens: int,
        stop: tuple[str, ...]) -> tuple[float, dict[str, str], dict[str, float]]:
    """One engine run: (wall seconds, answer text by question id, engine stats)."""
    from ggbatch.workers.llama.engine import LlamaEngine

    n_ctx_seq = max(len(q.tokens) for q in questions) + max_tokens + 1
    config = EngineConfig(model_path=model, n_threads=threads, slots=slots, n_ctx_seq=n_ctx_seq,
                          n_batch=max(512, slots), prefix_tokens=common_prefix([q.tokens for q in questions]),
                          generation=GenerationParams(max_tokens, stop), kv_unified=False, repack=False,
                          **LAYOUTS[layout])
    engine = LlamaEngine(config, worker_id=0)
    try:
        for q in questions:
            engine.add(q)
        t0 = time.perf_counter()
        texts: dict[str, str] = {}
        while engine.n_unfinished:
            texts.update((a.qid, a.text) for a in engine.step())
        return time.perf_counter() - t0, texts, engine.stats()
    finally:
        engine.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--slots", default="1,16")
    ap.add_argument("--layouts", default="streams,invariant")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    questions, plain = load_questions(args.model, args.questions)
    layouts = args.layouts.split(",")
    print(f"{len(questions)} questions, {sum(len(q.tokens) for q in questions)} prompt tokens, "
          f"{args.threads} threads", flush=True)
    first: dict[str, dict[str, str]] = {}
    for slots in (int(s) for s in args.slots.split(",")):
        times: dict[str, list[float]] = {name: [] for name in layouts}
        for _ in range(args.repeat):
            for name in layouts:
                dt, texts, stats = run(args.model, questions, slots, name, args.threads, args.max_tokens,
                                       PLAIN_STOP if plain else ())
                times[name].append(dt)
                base = first.setdefault(name, texts)
                differ = sum(texts[k] != base[k] for k in base)
                print(f"  slots {slots:3d} {name:9s} {dt:7.2f} s  {stats['generated_tokens']:.0f} generated, "
                      f"{stats['ballast_tokens']:.0f} ballast; {differ} of {len(base)} answers differ "
                      "from the first slot count's", flush=True)
        print(f"slots {slots}: " + ", ".join(f"{n} {statistics.median(t):.2f} s" for n, t in times.items()),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
