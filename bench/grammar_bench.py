"""What a grammar costs: the engine on GSM8K prompts (the model's chat template, a system prompt
asking for JSON), generation under a JSON schema's grammar against free generation of exactly as
many tokens per question (the free run is given each question's token count from the grammar run,
with ignore_eos, so both do the same decoding work), and the grammar applied to the whole
vocabulary at every step (llama.cpp's plain grammar sampler) against ggbatch's way (the grammar
asked about the token picked without it, the whole vocabulary masked only when it refuses that
token, as llama.cpp's common/sampling.cpp does). Runs alternate; the first is a grammar run.

    python bench/grammar_bench.py [--model M.gguf] [--questions 32] [--slots 32] [--max-tokens 96]
        [--repeat 2] [--threads 2]

Prints per mode: wall time, generated tokens, ms per generated token (whole step), sampling ms per
generated token, and how often the grammar refused the first pick. The model defaults to the
benchmark model (as bench/engine_bench.py builds it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from engine_bench import bench_model, load_questions  # noqa: E402
from ggbatch.runner.config.answer import schema_grammar  # noqa: E402
from ggbatch.runner.questions.prepare import common_prefix  # noqa: E402
from ggbatch.workers.protocol import AnswerSpec, EngineConfig, GenerationParams  # noqa: E402

SYSTEM = 'Answer in JSON: {"reasoning": "...", "answer": <a number>}.'
SCHEMA = {"type": "object", "properties": {"reasoning": {"type": "string"}, "answer": {"type": "number"}},
          "required": ["reasoning", "answer"]}
MODES = ("free", "grammar", "grammar-always-masked")


def run(model: str, questions: list[Any], mode: str, slots: int, threads: int, max_tokens: int,
        lengths: dict[str, int]) -> dict[str, Any]:
    from ggbatch.workers.llama.engine import LlamaEngine
    from ggbatch.workers.llama.sampling import Sampling

    answer = None if mode == "free" else AnswerSpec(grammar=schema_grammar(json.dumps(SCHEMA, sort_keys=True)))
    Sampling.grammar_check_first = mode != "grammar-always-masked"
    n_ctx_seq = max(len(q.tokens) for q in questions) + max_tokens + 1
    config = EngineConfig(model_path=model, n_threads=threads, slots=slots, n_ctx_seq=n_ctx_seq, n_batch=512,
                          prefix_tokens=common_prefix([q.tokens for q in questions]),
                          generation=GenerationParams(max_tokens, answer=answer), kv_unified=False, repack=False)
    engine = LlamaEngine(config, worker_id=0)
    try:
        for q in questions:
            # free: as many tokens as this question's answer under the grammar had
            own = GenerationParams(lengths[q.qid], ignore_eos=True) if mode == "free" else None
            engine.add(replace(q, generation=own))
        answers = []
        while engine.n_unfinished:
            answers += engine.step()
        st = engine.stats()
    finally:
        engine.close()
    parsed = sum(_parses(a.text) for a in answers)
    gen = st["generated_tokens"]
    return {"wall_s": st["step_s"], "generated": gen, "ms_per_token": 1000 * st["step_s"] / gen,
            "sample_ms_per_token": 1000 * st["sample_s"] / gen, "decode_ms_per_token": 1000 * st["decode_s"] / gen,
            "refused": st["grammar_resamples"] / max(1.0, st["grammar_tokens"]), "parsed": parsed,
            "length": sum(a.finish_reason.value == "length" for a in answers),
            "lengths": {a.qid: max(1, a.completion_tokens) for a in answers}}


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    model = args.model or bench_model()
    questions = load_questions(model, args.questions, SYSTEM)
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    lengths: dict[str, int] = {}
    for round_ in range(args.repeat):
        for mode in (modes if round_ % 2 else list(reversed(modes))):  # the first round ends with free
            r = run(model, questions, mode, args.slots, args.threads, args.max_tokens, lengths)
            lengths = lengths or r["lengths"]
            results[mode].append(r)
            print(f"round {round_ + 1} {mode:22s} {r['wall_s']:6.1f} s, {r['generated']:5.0f} tokens, "
                  f"{r['ms_per_token']:6.2f} ms/token (decode {r['decode_ms_per_token']:.2f}, sample "
                  f"{r['sample_ms_per_token']:.2f}), first pick refused {100 * r['refused']:.0f}%, "
                  f"{r['parsed']}/{len(questions)} parse, {r['length']} cut by max_tokens", flush=True)
    print("medians over rounds:")
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("wall_s", "ms_per_token", "sample_ms_per_token", "refused")}
        print(f"  {mode:22s} {med['wall_s']:6.1f} s, {med['ms_per_token']:6.2f} ms/token, sampling "
              f"{med['sample_ms_per_token']:.2f} ms/token, first pick refused {100 * med['refused']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
