"""The job's keys: each dotted key's value check (SCHEMA), the sections that hold them, and the
JobConfig field each sets (TARGET). One table for the job file's reader (runner/config/job_file.py),
the builder (runner/config/schema.py), the keyword and model_args checks that name keys, and the
command line, whose flags each name the key they set as their dest (runner/cli.py).
"""

from __future__ import annotations

from typing import Any, Callable

from ..files.formats import FORMATS
from ..files.piped import STDIN
from . import checks as check

MAX_SLOTS = 255  # llama.cpp LLAMA_MAX_SEQ (256) sequences per context, less the shared prefix one


# dotted key -> the check of its value, which returns what the JobConfig holds
SCHEMA: dict[str, Callable[[Any], Any]] = {
    "model": check.string(),
    "model.path": check.string(),
    "model.n_ctx": check.integer(16, allow_auto=True),
    "model.repack": check.bool_or_auto,
    "model.n_gpu_layers": check.gpu_layers,
    "devices": check.devices,
    "input": check.path(),
    "output": check.path(),
    "report": check.path(optional=True),
    "input_format": check.one_of(*FORMATS),
    "shard": check.shard,
    "output_format": check.one_of(*FORMATS),
    "errors_output": check.path(optional=True),
    "workers": check.integer(1, allow_auto=True),
    "threads": check.integer(1, allow_auto=True),
    "threads_adapt": check.auto_or_off,
    "slots": check.integer(1, allow_auto=True, hi=MAX_SLOTS,
                           why_hi=f" (a llama.cpp context holds at most {MAX_SLOTS + 1} sequences, one of them "
                                  "the shared prefix)"),
    "n_batch": check.integer(1, allow_auto=True),
    "max_tokens": check.integer(1),
    "system": check.string(optional=True),
    "prompt.template": check.string(optional=True),
    "prompt.chat_template": check.string(),
    "prompt.template_kwargs": check.template_kwargs,
    "keep_thinking": check.boolean,
    "reasoning.max_tokens": check.integer(0),
    "stop": check.stop,
    "ignore_eos": check.boolean,
    "batch_invariant": check.boolean,
    "flash_attn": check.bool_or_auto,
    "prefix_cache": check.auto_or_off,
    "fields.id": check.string(),
    "fields.question": check.string(),
    "sampling.temperature": check.number(0.0),
    "sampling.top_k": check.integer(0),
    "sampling.top_p": check.number(0.0, 1.0, lo_open=True),
    "sampling.min_p": check.number(0.0, 1.0),
    "sampling.repeat_penalty": check.number(0.0, lo_open=True),
    "sampling.repeat_last_n": check.integer(0),
    "sampling.presence_penalty": check.number(-2.0, 2.0),  # OpenAI's range
    "sampling.frequency_penalty": check.number(-2.0, 2.0),
    "sampling.seed": check.integer(0, hi=2**64 - 1),  # only hashed into per-question seeds
    "sampling.n": check.integer(1, hi=MAX_SLOTS, why_hi=f" (a question's samples decode together, in at most "
                                                           f"{MAX_SLOTS} slots)"),
    "answer.choices": check.choices,
    "answer.logprobs": check.boolean,
    "answer.choice_logits": check.boolean,
    "answer.choice_scoring": check.choice_scoring,
    "answer.token_logprobs": check.integer(0, hi=20, why_hi=" (at most 20 alternatives per token, as OpenAI)"),
    "answer.json_schema": check.json_schema,
    "answer.grammar": check.grammar,
    "backend": check.backend,
    "ray_address": check.ray_address,
}
SECTIONS = {"model", "prompt", "fields", "sampling", "answer", "reasoning"}  # keys that may hold a mapping
LEAF_MAPPINGS = {"answer.json_schema"}  # keys whose value is itself a mapping
PATH_KEYS = ("model", "model.path", "input", "output", "report", "errors_output", "answer.json_schema",
             "answer.grammar")
# dotted key -> the JobConfig field it sets, where not named alike (sampling.* set SamplingParams' fields)
TARGET = {"model.path": "model", "model.n_ctx": "n_ctx", "model.repack": "repack",
           "model.n_gpu_layers": "n_gpu_layers", "prompt.template": "prompt_template",
           "prompt.chat_template": "chat_template", "prompt.template_kwargs": "template_kwargs",
           "fields.id": "id_field",
           "fields.question": "question_field", "answer.choices": "choices", "answer.logprobs": "choice_logprobs",
           "answer.choice_logits": "choice_logits", "answer.choice_scoring": "choice_scoring",
           "answer.token_logprobs": "token_logprobs",
           "answer.json_schema": "json_schema",
           "answer.grammar": "grammar", "reasoning.max_tokens": "thinking_budget"}


STREAM_KEYS = ("input", "output", "report", "errors_output")  # where `-` is standard input or output


def not_a_path(key: str, value: str) -> bool:
    """A schema or a grammar written in the job file itself; `-`: standard input for `input`
    (runner/files/piped.py), refused for a file written as `--output -` is (made `<jobdir>/-`, a file
    named `-` was written); "": refused by the key's check (made the job's folder, it was not)."""
    if not value:
        return True
    if key in STREAM_KEYS:
        return value == STDIN
    if key == "answer.grammar":
        return check.is_grammar_text(value)
    return value.lstrip().startswith("{")
