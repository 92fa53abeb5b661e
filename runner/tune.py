"""`ggbatch tune`: try layouts (workers × threads × slots) on a sample of the user's questions,
keep the fastest, and remember it per machine and model so that `auto` uses it from then on.

Each trial is a real run of the whole runner (the same code path as `ggbatch run`) with exactly
max_tokens generated per question; the rate is generated tokens per second from the first worker
ready to the last answer, so model loading does not favour small layouts.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from runner.config import build_config
from runner.inputs import read_records
from runner.memory import MIB
from runner.outputs import write_atomic
from runner.planning import usable_cores
from runner.report import model_identity

log = logging.getLogger("ggbatch")

SAMPLE_QUESTIONS = [f"A shop sells {a} pens for {b} dollars. How much do {c} pens cost? Show the steps."
                    for a, b, c in ((3, 2, 12), (5, 4, 30), (7, 3, 21), (4, 9, 16), (6, 5, 18), (8, 2, 40))]


def cache_file() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ggbatch" / "layouts.json"


def machine_key() -> str:
    """The machine and the cores this process may use: a choice is only valid where it was made."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.node()}|{cpu}|cores={','.join(map(str, usable_cores()))}"


def _key(model_path: str) -> str:
    ident = model_identity(model_path)
    return f"{machine_key()}|{ident['size_bytes']}:{ident['sha256_first_mib']}"


def load_choice(model_path: str) -> Optional[dict[str, int]]:
    """The layout `tune` chose for this model on this machine, if any."""
    try:
        entry = json.loads(cache_file().read_text()).get(_key(model_path))
    except (OSError, ValueError):
        return None
    return entry["choice"] if entry else None


def save_choice(model_path: str, choice: dict[str, int], trials: Sequence[dict[str, Any]]) -> Path:
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[_key(model_path)] = {"choice": choice, "trials": list(trials)}
    write_atomic(str(path), json.dumps(data, indent=1) + "\n")
    return path


def candidates(n_cores: int, slot_options: Sequence[int]) -> list[dict[str, int]]:
    """Every split of the cores into equal workers, with every slot count."""
    return [{"workers": w, "threads": n_cores // w, "slots": s}
            for w in range(1, n_cores + 1) if n_cores % w == 0 for s in slot_options]


def rough_seconds(model_bytes: int, n_trials: int, n_questions: int, max_tokens: int) -> float:
    """A deliberately rough guess said before starting: ~100 generated tokens/s for a 400 MiB
    model on 2 cores, slower in proportion to the model's size, plus prompts and loading."""
    rate = 100.0 * (400 * MIB) / max(model_bytes, 1) * len(usable_cores()) / 2
    return n_trials * (n_questions * max_tokens / rate * 1.5 + 3.0)


def write_sample(input_path: Optional[str], n: int, folder: str, id_field: str, question_field: str) -> str:
    """The first n questions of the user's file (or built-in ones) as a JSONL file in folder."""
    if input_path:
        records = [dict(r.fields) for r in read_records(input_path, id_field, question_field)[:n]]
    else:
        records = [{id_field: f"t{i}", question_field: SAMPLE_QUESTIONS[i % len(SAMPLE_QUESTIONS)] + f" (#{i})"}
                   for i in range(n)]
    path = os.path.join(folder, "sample.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return path


def tune(model_path: str, input_path: Optional[str], n_questions: int, max_tokens: int,
         slot_options: Sequence[int], settings: dict[str, Any],
         on_trial: Callable[[dict[str, Any]], None] = lambda trial: None,
         ) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Run every candidate layout on the sample; returns (fastest layout, all trials)."""
    from runner.job import run_job

    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ggbatch-tune-") as tmp:
        sample = write_sample(input_path, n_questions, tmp, settings.get("fields.id", "questionID"),
                              settings.get("fields.question", "question"))
        for layout in candidates(len(usable_cores()), slot_options):
            config = build_config([("tune", {**settings, "model": model_path, "input": sample,
                                             "output": os.path.join(tmp, "answers.jsonl"),
                                             "max_tokens": max_tokens, "ignore_eos": True, **layout})])
            report = run_job(config, progress_bar=False, fresh=True, use_tuned=False)
            t = report["timings_s"]
            seconds = t["total_s"] - (t["first_worker_ready_s"] or 0.0)
            used = report["layout"]
            trial = {"workers": used["workers"], "threads": used["threads_per_worker"],
                     "slots": used["slots_per_worker"],
                     "generated_tok_s": round(report["tokens"]["generated"] / seconds, 2),
                     "wall_s": round(t["total_s"], 2)}
            trials.append(trial)
            on_trial(trial)
    best = max(trials, key=lambda r: r["generated_tok_s"])
    return {k: best[k] for k in ("workers", "threads", "slots")}, trials
