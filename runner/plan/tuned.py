"""What `ggbatch tune` measured, as the job path reads it: the fastest layout per machine, model
and context, kept in ggbatch's cache folder (layouts.json), and the lookup a job with an `auto`
layout makes before its workers start.

The context is bucketed (tokens per sequence rounded up to a power of two): the best layout for
200-token sequences is not the best for 4,000-token ones, but one for 300 serves 400 as well.
The cache file maps machine|model to {"contexts": {bucket: {"choice", "trials"}}}.
"""

from __future__ import annotations

import json
import logging
import math
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config.schema import JobConfig
from ..files.inputs import Record
from ..files.outputs import write_atomic
from ..files.paths import ggbatch_cache
from ..model.identity import ModelIdentity
from ..words import layout_words
from .layout import estimate_context, usable_cores

log = logging.getLogger("ggbatch")

# The smallest context bucket: below it a layout's speed hardly depends on the context.
MIN_CONTEXT_BUCKET = 256


def cache_file() -> Path:
    return ggbatch_cache() / "layouts.json"


def machine_key() -> str:
    """The machine and the cores this process may use: a choice is only valid where it was made."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.node()}|{cpu}|cores={','.join(map(str, usable_cores()))}"


def _key(model: ModelIdentity) -> str:
    return f"{machine_key()}|{model.digest}"


def context_bucket(n_ctx_seq: int) -> int:
    """Tokens per sequence rounded up to a power of two, at least MIN_CONTEXT_BUCKET."""
    return max(MIN_CONTEXT_BUCKET, 1 << max(n_ctx_seq - 1, 0).bit_length())


def nearest_bucket(buckets: Iterable[int], n_ctx_seq: int) -> int | None:
    """The saved bucket nearest to this context by ratio (log2 distance); between two equally near
    the larger, whose layout was measured with more KV per sequence. None if nothing is saved.
    The job's own context is compared, not its bucket: rounded up first, every job of 257-511
    tokens was as near 1024 as 256 (both one doubling from 512) and took 1024's layout."""
    target = math.log2(max(n_ctx_seq, MIN_CONTEXT_BUCKET))
    return min(buckets, key=lambda b: (abs(math.log2(b) - target), -b), default=None)


def _contexts(entry: Any) -> dict[int, dict[str, Any]]:
    """{bucket: {"choice", "trials"}} of one cache entry. Entries written before choices were kept
    per context ({"choice", "trials"} alone) have none: their context is unknown, so they are
    ignored, and the next tune of that model replaces them."""
    contexts = entry.get("contexts") if isinstance(entry, dict) else None
    if not isinstance(contexts, dict):
        return {}
    return {int(b): saved for b, saved in contexts.items()
            if str(b).isdigit() and int(b) > 0 and isinstance(saved, dict) and "choice" in saved}


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_choice(model: ModelIdentity, n_ctx_seq: int) -> tuple[int, dict[str, int]] | None:
    """(bucket, layout) that `tune` chose for this model on this machine at the saved context
    nearest to n_ctx_seq tokens per sequence, if any."""
    contexts = _contexts(_read_cache(cache_file()).get(_key(model)))
    bucket = nearest_bucket(contexts, n_ctx_seq)
    return None if bucket is None else (bucket, contexts[bucket]["choice"])


def save_choice(model: ModelIdentity, choice: dict[str, int], trials: Sequence[dict[str, Any]],
                n_ctx_seq: int) -> Path:
    """Remember the layout for this machine, model and context bucket, keeping other buckets."""
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_cache(path)
    key = _key(model)
    contexts = {**_contexts(data.get(key)),
                context_bucket(n_ctx_seq): {"choice": choice, "trials": list(trials)}}
    data[key] = {"contexts": {str(b): contexts[b] for b in sorted(contexts)}}
    write_atomic(str(path), json.dumps(data, indent=1) + "\n")
    return path


def sample_context(trials: Sequence[dict[str, Any]]) -> int:
    """Tokens per sequence the trials ran with (the same sample and max_tokens for all)."""
    return int(max(t["n_ctx_per_sequence"] for t in trials))


def longest_prompt_chars(records: Sequence[Record], config: JobConfig) -> int:
    """Characters of the longest prompt before the chat template: system prompt and user message.
    A prompt template may use any field, so then every field and the template's own text count
    (an overestimate, like the guess it feeds)."""
    def message_chars(rec: Record) -> int:
        if rec.request is not None:
            return rec.request.chars
        if config.prompt_template is None:
            return len(str(rec.fields.get(config.question_field, "")))
        return len(config.prompt_template) + sum(len(str(v)) for v in rec.fields.values())

    return len(config.system or "") + max(map(message_chars, records), default=0)


def largest_max_tokens(records: Sequence[Record], config: JobConfig) -> int:
    """The most tokens any record may generate: its line's own max_tokens, or the job's."""
    return max(((r.request and r.request.settings.max_tokens) or config.max_tokens for r in records),
               default=config.max_tokens)


def for_job(config: JobConfig, model: ModelIdentity, records: Sequence[Record]) -> Optional[dict[str, Any]]:
    """The layout `ggbatch tune` chose for this model on this machine at the context nearest this
    job's, when the job leaves workers, threads and slots all to auto. Workers start before the
    questions are tokenized, so the job's context is guessed from their characters."""
    if (config.workers, config.threads, config.slots) != (None, None, None):
        return None
    n_ctx_guess = estimate_context(longest_prompt_chars(records, config), largest_max_tokens(records, config),
                                   config.n_ctx)
    found = load_choice(model, n_ctx_guess)
    if found is None:
        return None
    bucket, choice = found
    log.info("layout from ggbatch tune (%s, tuned for <= %d tokens per sequence, this job ~%d): "
             "%s", cache_file(), bucket, n_ctx_guess,
             layout_words(choice["workers"], choice["threads"], choice["slots"], up_to=True))
    return choice
