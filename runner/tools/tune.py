"""`ggbatch tune`: try layouts (workers × threads × slots × weight layout) on a sample of the
user's questions and save the fastest where the job path reads it (runner/plan/tuned.py), per machine,
model and context, so that `auto` uses it from then on.

Each trial is a real run of the whole runner (the same code path as `ggbatch run`) with exactly
max_tokens generated per question; the rate is generated tokens per second from the first worker
ready to the last answer, so model loading does not favour small layouts.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional, Sequence

from ..config.schema import build_config
from ..errors import GgbatchError
from ..files.inputs import read_records
from ..plan.layout import usable_cores
from ..plan.memory import MIB
from ..plan.repack import cpu_flags, model_is_hybrid
from ..plan.repack_check import repack_refused
from ..plan.repack_share import nothing_to_repack

SAMPLE_QUESTIONS = [f"A shop sells {a} pens for {b} dollars. How much do {c} pens cost? Show the steps."
                    for a, b, c in ((3, 2, 12), (5, 4, 30), (7, 3, 21), (4, 9, 16), (6, 5, 18), (8, 2, 40))]


def candidates(n_cores: int, slot_options: Sequence[int], n_questions: int,
               batch_invariant: bool = False, plain_only: bool = False) -> list[dict[str, int]]:
    """Every split of the cores into equal workers, with every slot count the sample can fill,
    with the weights repacked by llama.cpp and not (which is faster depends on the CPU and the
    batch: repack.repack_weights; a batch_invariant job never repacks, nor does `plain_only`: a
    hybrid model, or a CPU that refuses the repacked kernels). `workers` workers share
    n_questions, so slots beyond each one's share would stay empty and the trial would repeat a
    smaller one under a bigger name.
    The smallest slot count always stays."""
    smallest = min(slot_options)
    return [{"workers": w, "threads": n_cores // w, "slots": s, "repack": repack}
            for w in range(1, n_cores + 1) if n_cores % w == 0
            for s in slot_options if s == smallest or s <= math.ceil(n_questions / w)
            for repack in ((False,) if batch_invariant or plain_only else (True, False))]


def plain_weights_only(model_path: str, batch_invariant: bool) -> bool:
    """Whether no trial may repack the weights besides batch_invariant's own rule: a hybrid model,
    a file with nothing llama.cpp repacks here (an f16 model's repacked and plain trials are the
    same run), or a CPU that refuses the repacked kernels (repack.repack_weights)."""
    return (model_is_hybrid(model_path) or nothing_to_repack(model_path, cpu_flags())
            or bool(repack_refused(batch_invariant)))


def rough_seconds(model_bytes: int, n_trials: int, n_questions: int, max_tokens: int) -> float:
    """A deliberately rough guess said before starting: ~100 generated tokens/s for a 400 MiB
    model on 2 cores, slower in proportion to the model's size, plus prompts and loading."""
    rate = 100.0 * (400 * MIB) / max(model_bytes, 1) * len(usable_cores()) / 2
    return n_trials * (n_questions * max_tokens / rate * 1.5 + 3.0)


def said_duration(seconds: float) -> str:
    """A rough guess as a person says it: seconds under a minute (never "0 min"), else minutes."""
    if seconds < 57.5:
        return f"about {max(5, 5 * round(seconds / 5))} s"
    return f"about {max(1, round(seconds / 60))} min"


class NothingMeasured(GgbatchError):
    """No trial generated a token (every sample question failed): no layout is faster than
    another, and saving one would steer every later `auto` run. Exit 1, as a run whose questions
    failed."""

    exit_code = 1


def write_sample(input_path: Optional[str], n: int, folder: str, id_field: str, question_field: str,
                 input_format: Optional[str] = None) -> tuple[str, int]:
    """(a JSONL file in folder of the first n questions of the user's file, read as input_format
    (None: as its name says), or built-in ones; how many it holds: fewer than n when the file
    holds fewer)."""
    if input_path:
        records = [dict(r.fields) for r in read_records(input_path, id_field, question_field, input_format)[:n]]
    else:
        records = [{id_field: f"t{i}", question_field: SAMPLE_QUESTIONS[i % len(SAMPLE_QUESTIONS)] + f" (#{i})"}
                   for i in range(n)]
    path = os.path.join(folder, "sample.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return path, len(records)


def tune(model_path: str, sample: str, n_questions: int, max_tokens: int,
         slot_options: Sequence[int], settings: dict[str, Any],
         on_trial: Callable[[dict[str, Any]], None] = lambda trial: None, plain_only: Optional[bool] = None,
         ) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Run every candidate layout on the sample (write_sample's file of n_questions; the answers
    go beside it); returns (fastest layout, all trials). `plain_only`: plain_weights_only's
    answer, when the caller has it already. NothingMeasured when no trial generated a token."""
    from ..job import run_job

    trials: list[dict[str, Any]] = []
    invariant = settings.get("batch_invariant") is True
    if plain_only is None:
        plain_only = plain_weights_only(model_path, invariant)
    for layout in candidates(len(usable_cores()), slot_options, n_questions, invariant, plain_only):
        # the sample is JSONL whatever the job's files are: its formats are tune's (TUNE_OWNS)
        config = build_config([("tune", {**settings, "model": model_path, "input": sample,
                                         "output": os.path.join(os.path.dirname(sample), "answers.jsonl"),
                                         "max_tokens": max_tokens, "ignore_eos": True,
                                         "workers": layout["workers"], "threads": layout["threads"],
                                         "threads_adapt": "off",
                                         "slots": layout["slots"], "model.repack": layout["repack"]})])
        report = run_job(config, progress="off", fresh=True, use_tuned=False)
        t = report.outcome.timings
        total_s = t["total_s"]
        assert total_s is not None  # a run that returned has its total time
        seconds = total_s - (t["first_worker_ready_s"] or 0.0)
        used = report.setup.layout
        generated = report.outcome.tally.generated_tokens
        trial = {"workers": used.workers, "threads": used.threads, "slots": used.slots,
                 "repack": used.repack, "n_ctx_per_sequence": used.n_ctx_seq,
                 "generated_tok_s": round(generated / seconds, 2), "wall_s": round(total_s, 2)}
        trials.append(trial)
        on_trial(trial)
    if not any(trial["generated_tok_s"] > 0 for trial in trials):
        raise NothingMeasured(f"tune: no trial generated a token (every one of the {n_questions} sample questions "
                              "failed; `ggbatch run` of them says why): no layout saved")
    best = max(trials, key=lambda r: r["generated_tok_s"])
    return {k: best[k] for k in ("workers", "threads", "slots", "repack")}, trials
