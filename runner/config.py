"""Job configuration: one loader, one schema, unknown keys rejected, errors that name the key.

Precedence: command-line flags > job file > defaults. Relative paths in a job file are relative
to the job file's folder; relative paths given as flags are relative to the current directory.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
import json
from typing import Any, Callable, Mapping, Optional, Union

import yaml

from .errors import ConfigError, quote
from .formats import FORMATS
from .gpu import GPU_ALL
from .hub import is_hub_name
from .shards import Shard, parse_shard, shard_path
from ..workers.protocol import SamplingParams

AUTO = None  # "auto" in a job file or on the command line is stored as None
CHOICES_AUTO = "auto"  # answer.choices: auto, each record's own `choices`
MAX_SLOTS = 255  # llama.cpp LLAMA_MAX_SEQ (256) sequences per context, less the shared prefix one


@dataclass(frozen=True)
class JobConfig:
    model: str = ""  # path to a GGUF file, or "demo" for the generated demo model
    input: str = ""
    output: str = ""
    report: Optional[str] = None
    input_format: Optional[str] = AUTO  # json, jsonl, csv or openai; auto: by extension and content
    shard: Optional[Shard] = None  # answer only this shard's questions (runner/shards.py)
    output_format: Optional[str] = AUTO  # json, jsonl, csv or openai; auto: runner/formats/detect.py
    errors_output: Optional[str] = None  # questions without an answer go here instead of output
    n_ctx: Optional[int] = AUTO  # context per sequence; auto = longest prompt + max_tokens
    workers: Optional[int] = AUTO
    threads: Optional[int] = AUTO
    threads_adapt: str = "auto"  # auto: fewer llama.cpp threads while other processes take the cores; off
    slots: Optional[int] = AUTO
    repack: Optional[bool] = AUTO  # llama.cpp's CPU_REPACK weight layout; auto: layout.repack_weights
    n_gpu_layers: Optional[int] = AUTO  # layers in VRAM, GPU_ALL for all; auto: gpu.gpu_layers_for
    devices: tuple[int, ...] = ()  # one worker per GPU (runner/gpu.py)
    n_batch: int = 512
    max_tokens: int = 256
    system: Optional[str] = None
    prompt_template: Optional[str] = None  # Jinja over the record's fields -> the user message
    chat_template: str = "auto"  # "auto" (the model's own), "plain", or a Jinja chat template
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"enable_thinking": False}
    keep_thinking: bool = False  # also write a reasoning model's <think> block, as "thinking"
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    batch_invariant: bool = False  # answers independent of batch-mates (per-sequence KV, slower)
    prefix_cache: str = "auto"  # "auto": prompts sharing a prefix are sent together and reuse its KV; "off"
    id_field: str = "questionID"
    question_field: str = "question"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # What an answer must be (runner/answer_spec.py): one of fixed choices (or CHOICES_AUTO), JSON
    # under a schema (canonical JSON text), or a GBNF grammar; at most one of the three.
    choices: Union[tuple[str, ...], str] = ()
    choice_logprobs: bool = False  # write each choice's log-probability
    choice_logits: bool = True  # false: single-token choices generated under the grammar too
    json_schema: Optional[str] = None
    grammar: Optional[str] = None
    backend: str = "local"  # where workers live: local processes, or Ray actors (runner/ray_workers.py)
    ray_address: Optional[str] = None  # the Ray cluster to join (HOST:PORT or auto); None: start one here


# -- value checks: each returns the converted value or raises ValueError("must be ...") ----------


INT32_MAX = 2**31 - 1  # llama.cpp's counts and sizes are 32-bit ints


def _int(lo: int, allow_auto: bool = False, hi: int = INT32_MAX,
         why_hi: str = "") -> Callable[[Any], Optional[int]]:
    def check(v: Any) -> Optional[int]:
        if allow_auto and v == "auto":
            return AUTO
        if isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v.strip()) <= 20:
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"must be an integer{' or auto' if allow_auto else ''}")
        if v < lo:
            raise ValueError(f"must be >= {lo}")
        if v > hi:
            raise ValueError(f"must be <= {hi}{why_hi}")
        return v
    return check


def _float(lo: float, hi: float = float("inf"), lo_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        try:
            if isinstance(v, bool):
                raise TypeError
            f = float(v)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("must be a number") from None
        # nan compares false with every bound and would pass them; it also never equals itself,
        # so a journal fingerprinted with it could never be resumed.
        if not math.isfinite(f):
            raise ValueError("must be a finite number")
        if f < lo or (lo_open and f == lo) or f > hi:
            bound = f"> {lo}" if lo_open else f">= {lo}"
            raise ValueError(f"must be {bound}" + (f" and <= {hi}" if hi != float("inf") else ""))
        return f
    return check


def _str(optional: bool = False) -> Callable[[Any], Optional[str]]:
    def check(v: Any) -> Optional[str]:
        if v is None and optional:
            return None
        if not isinstance(v, str) or (not optional and not v):
            raise ValueError("must be a non-empty string" if not optional else "must be a string")
        return v
    return check


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise ValueError("must be true or false")


def bool_or_auto(v: Any) -> Optional[bool]:
    """true / false / auto (None), as in a job file or on the command line."""
    if v == "auto":
        return AUTO
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    if isinstance(v, bool):
        return v
    raise ValueError("must be true, false or auto")


def _choice(*choices: str) -> Callable[[Any], Optional[str]]:
    def check(v: Any) -> Optional[str]:
        if v == "auto":
            return AUTO
        if v not in choices:
            raise ValueError(f"must be auto, {', '.join(choices[:-1])} or {choices[-1]}")
        return v
    return check


def _auto_or_off(v: Any) -> str:
    """auto or off; YAML reads a bare `off` as false (and `on` as true)."""
    if isinstance(v, bool):
        return "auto" if v else "off"
    if v not in ("auto", "off"):
        raise ValueError("must be auto or off")
    return v


def _mapping(v: Any) -> dict[str, Any]:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise ValueError("must be a mapping of names to values")
    return dict(v)


def _gpu_layers(v: Any) -> Optional[int]:
    """A layer count, `all` (as llama.cpp's -ngl all) or `auto`."""
    if v == "all":
        return GPU_ALL
    try:
        return _int(0, allow_auto=True)(v)
    except ValueError:
        raise ValueError("must be an integer >= 0, all or auto") from None


def _devices(v: Any) -> tuple[int, ...]:
    """GPU numbers: `0,1` or a list [0, 1]; none (an empty list) is no GPU worker layout."""
    items = [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v
    if isinstance(items, int) and not isinstance(items, bool):
        items = [items]
    try:
        devices = tuple(_int(0)(x) for x in items)
    except (TypeError, ValueError):
        raise ValueError("must be GPU numbers, as 0,1 or a list") from None
    if len(set(devices)) != len(devices):
        raise ValueError("must name each GPU once")
    return devices


def _shard(v: Any) -> Optional[Shard]:
    """`I/N`, or `auto`: this task's shard of a Slurm job array (read from its variables here)."""
    return None if v is None else parse_shard(v, os.environ)


def _backend(v: Any) -> str:
    if v not in ("local", "ray"):
        raise ValueError("must be local or ray")
    return v


def _ray_address(v: Any) -> Optional[str]:
    """auto (the cluster this machine belongs to) or HOST:PORT, a Ray head's GCS address."""
    if v is None:
        return None
    if not isinstance(v, str) or not (v == "auto" or (":" in v and v.rpartition(":")[2].isdigit()
                                                     and v.rpartition(":")[0])):
        raise ValueError("must be auto or HOST:PORT (a Ray head's address, as `ray start --head` prints it)")
    return v


def _stop(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise ValueError("must be a list of non-empty strings")
    return tuple(v)


def _choices(v: Any) -> Union[tuple[str, ...], str]:
    """`A,B,C,D`, a list, or auto (each record's `choices`)."""
    if v == CHOICES_AUTO:
        return CHOICES_AUTO
    items = [x.strip() for x in v.split(",")] if isinstance(v, str) else v
    if not isinstance(items, list) or len(items) < 2 or not all(isinstance(c, str) and c for c in items):
        raise ValueError("must be two or more non-empty strings (A,B,C,D or a list), or auto")
    if len(set(items)) != len(items):
        raise ValueError("must name each choice once")
    return tuple(items)


def _json_schema(v: Any) -> str:
    """A schema (a mapping, or its JSON text) or the path of a .json file holding one; kept as
    canonical JSON text (sorted keys), which the journal fingerprints."""
    if isinstance(v, str) and not v.lstrip().startswith("{"):
        try:
            v = Path(v).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the schema file ({getattr(exc, 'strerror', None) or exc})") from None
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as exc:
            raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(v, Mapping):
        raise ValueError("must be a JSON Schema object, or the path of a .json file holding one")
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _grammar(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be GBNF text with a `root` rule")
    return v


# dotted key -> (JobConfig field or "sampling.<field>", check)
SCHEMA: dict[str, Callable[[Any], Any]] = {
    "model": _str(),
    "model.path": _str(),
    "model.n_ctx": _int(16, allow_auto=True),
    "model.repack": bool_or_auto,
    "model.n_gpu_layers": _gpu_layers,
    "devices": _devices,
    "input": _str(),
    "output": _str(),
    "report": _str(optional=True),
    "input_format": _choice(*FORMATS),
    "shard": _shard,
    "output_format": _choice(*FORMATS),
    "errors_output": _str(optional=True),
    "workers": _int(1, allow_auto=True),
    "threads": _int(1, allow_auto=True),
    "threads_adapt": _auto_or_off,
    "slots": _int(1, allow_auto=True, hi=MAX_SLOTS,
                  why_hi=f" (a llama.cpp context holds at most {MAX_SLOTS + 1} sequences, one of them "
                         "the shared prefix)"),
    "n_batch": _int(1),
    "max_tokens": _int(1),
    "system": _str(optional=True),
    "prompt.template": _str(optional=True),
    "prompt.chat_template": _str(),
    "prompt.template_kwargs": _mapping,
    "keep_thinking": _bool,
    "stop": _stop,
    "ignore_eos": _bool,
    "batch_invariant": _bool,
    "prefix_cache": _auto_or_off,
    "fields.id": _str(),
    "fields.question": _str(),
    "sampling.temperature": _float(0.0),
    "sampling.top_k": _int(0),
    "sampling.top_p": _float(0.0, 1.0, lo_open=True),
    "sampling.min_p": _float(0.0, 1.0),
    "sampling.repeat_penalty": _float(0.0, lo_open=True),
    "sampling.repeat_last_n": _int(0),
    "sampling.seed": _int(0, hi=2**64 - 1),  # only hashed into per-question seeds
    "answer.choices": _choices,
    "answer.logprobs": _bool,
    "answer.choice_logits": _bool,
    "answer.json_schema": _json_schema,
    "answer.grammar": _grammar,
    "backend": _backend,
    "ray_address": _ray_address,
}
SECTIONS = {"model", "prompt", "fields", "sampling", "answer"}  # keys that may hold a mapping
LEAF_MAPPINGS = {"answer.json_schema"}  # keys whose value is itself a mapping
PATH_KEYS = ("model", "model.path", "input", "output", "report", "errors_output", "answer.json_schema")
_TARGET = {"model.path": "model", "model.n_ctx": "n_ctx", "model.repack": "repack",
           "model.n_gpu_layers": "n_gpu_layers", "prompt.template": "prompt_template",
           "prompt.chat_template": "chat_template", "prompt.template_kwargs": "template_kwargs",
           "fields.id": "id_field",
           "fields.question": "question_field", "answer.choices": "choices", "answer.logprobs": "choice_logprobs",
           "answer.choice_logits": "choice_logits", "answer.json_schema": "json_schema",
           "answer.grammar": "grammar"}


def flatten(mapping: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """{"sampling": {"seed": 1}} -> {"sampling.seed": 1}, rejecting unknown keys with a hint."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if dotted in SECTIONS and dotted not in LEAF_MAPPINGS and isinstance(value, Mapping):
            flat.update(flatten(value, source, dotted + "."))
        elif dotted in SCHEMA:
            flat[dotted] = value
        else:
            known = [k[len(prefix):] for k in SCHEMA if k.startswith(prefix) and "." not in k[len(prefix):]]
            known += [s for s in SECTIONS if not prefix and s not in known]
            hint = difflib.get_close_matches(str(key), known, n=1)
            where = f" in {prefix[:-1]}" if prefix else ""
            raise ConfigError(f"{source}: unknown key '{key}'{where}"
                              + (f" (did you mean '{hint[0]}'?)" if hint else ""))
    return flat


def load_job_file(path: str) -> dict[str, Any]:
    """Read a YAML job file into flat dotted keys, paths made relative to the file's folder."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: job file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read job file: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: a job file must be a mapping of keys to values")
    flat = flatten(data, str(path))
    base = p.resolve().parent
    for key in PATH_KEYS:
        value = flat.get(key)
        if isinstance(value, str) and value != "demo" and not Path(value).expanduser().is_absolute() \
                and not value.lstrip().startswith("{"):  # an inline JSON schema is no path
            if key.startswith("model") and is_hub_name(value) and not (base / value).exists():
                continue  # a Hugging Face model name (runner/hub.py), not a path beside the job file
            flat[key] = str(base / value)
    return flat


def build_config(layers: list[tuple[str, Mapping[str, Any]]]) -> JobConfig:
    """Apply flat key/value layers in order (later wins) over the defaults, checking each value.
    Each layer is (source name for errors, {dotted key: value})."""
    values: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    for source, layer in layers:
        for key, raw in layer.items():
            if key not in SCHEMA:
                raise ConfigError(f"{source}: unknown key '{key}'")
            try:
                value = SCHEMA[key](raw)
            except ValueError as exc:
                raise ConfigError(f"{source}: {key}: {exc}, got {quote(raw)}") from None
            if key.startswith("sampling."):
                sampling[key.split(".", 1)[1]] = value
            else:
                values[_TARGET.get(key, key)] = value
    config = replace(JobConfig(), **values, sampling=SamplingParams(**sampling))
    for key in ("model", "input", "output"):
        if not getattr(config, key):
            raise ConfigError(f"missing required setting '{key}' (give it in the job file or as --{key})")
    _check_answer(config)
    return _shard_files(config)


def _check_answer(config: JobConfig) -> None:
    given = [key for key, value in (("answer.choices", config.choices), ("answer.json_schema", config.json_schema),
                                    ("answer.grammar", config.grammar)) if value]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: give one of them (an answer is one choice, JSON or a grammar's)")
    if config.choice_logprobs and not config.choices:
        raise ConfigError("answer.logprobs: needs answer.choices (log-probabilities are the choices')")
    _check_backend(config)
    return _shard_files(config)


def _check_backend(config: JobConfig) -> None:
    """Settings that make sense with one backend only."""
    if config.ray_address is not None and config.backend != "ray":
        raise ConfigError(f"ray_address: {config.ray_address} is for backend: ray (--backend ray), "
                          f"the backend is {config.backend}")
    if config.backend == "ray" and config.devices:
        raise ConfigError("devices: GPUs are not laid out on the Ray backend (yet); use backend: local")


def _shard_files(config: JobConfig) -> JobConfig:
    """A shard writes files of its own (answers.shard-2-of-8.jsonl, and its journal beside it), so
    every task of a job array can run the same job file."""
    if config.shard is None:
        return config
    named = {key: getattr(config, key) for key in ("output", "report", "errors_output")}
    return replace(config, **{key: shard_path(path, config.shard) for key, path in named.items() if path})
