"""Job configuration: one loader, one schema, unknown keys rejected, errors that name the key.

Precedence: command-line flags > job file > defaults. Relative paths in a job file are relative
to the job file's folder; relative paths given as flags are relative to the current directory.
"""

from __future__ import annotations

import difflib
import os
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import yaml

from ...workers.protocol import SamplingParams
from ..errors import ConfigError, KeysError, ModelError, quote
from ..files.formats import FORMATS
from ..files.paths import ERRORS_OUTPUT, OUTPUT, REPORT, check_file_name, check_not_a_stream
from ..files.piped import STDIN
from ..files.shards import shard_path
from ..model.hub import is_hub_name
from . import checks as check
from .between_keys import check_between_keys
from .checks import AUTO, CHOICES_AUTO, FIRST_TOKEN, LOGLIKELIHOOD
from .job_config import JobConfig
from .job_yaml import read_job_yaml

# What the rest of the runner takes from here; AUTO and CHOICES_AUTO (the values a JobConfig
# holds for `auto`) are the value checks', which produce them.
__all__ = ["AUTO", "CHOICES_AUTO", "FIRST_TOKEN", "LOGLIKELIHOOD", "MAX_SLOTS", "SCHEMA", "JobConfig", "build_config",
           "flatten", "load_job_file"]

MAX_SLOTS = 255  # llama.cpp LLAMA_MAX_SEQ (256) sequences per context, less the shared prefix one


# dotted key -> (JobConfig field or "sampling.<field>", check)
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
_TARGET = {"model.path": "model", "model.n_ctx": "n_ctx", "model.repack": "repack",
           "model.n_gpu_layers": "n_gpu_layers", "prompt.template": "prompt_template",
           "prompt.chat_template": "chat_template", "prompt.template_kwargs": "template_kwargs",
           "fields.id": "id_field",
           "fields.question": "question_field", "answer.choices": "choices", "answer.logprobs": "choice_logprobs",
           "answer.choice_logits": "choice_logits", "answer.choice_scoring": "choice_scoring",
           "answer.token_logprobs": "token_logprobs",
           "answer.json_schema": "json_schema",
           "answer.grammar": "grammar", "reasoning.max_tokens": "thinking_budget"}


def flatten(mapping: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """{"sampling": {"seed": 1}} -> {"sampling.seed": 1}, rejecting unknown keys with a hint."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if dotted in SECTIONS and dotted not in LEAF_MAPPINGS and isinstance(value, Mapping):
            nested = flatten(value, source, dotted + ".")
            _check_once(flat, nested, source)
            flat.update(nested)
        elif dotted in SECTIONS and dotted not in SCHEMA:  # a section with no value of its own (`model` has one)
            if value is not None:  # `sampling:` with every key commented out sets nothing
                raise _not_a_mapping(source, dotted, value)
        elif dotted in SCHEMA:
            _check_once(flat, {dotted: value}, source)
            flat[dotted] = value
        else:
            where = f" in {prefix[:-1]}" if prefix else ""
            raise ConfigError(f"{source}: unknown key '{key}'{where}{_key_hint(str(key), prefix)}")
    return flat


def _check_once(flat: Mapping[str, Any], more: Mapping[str, Any], source: str) -> None:
    """A key written dotted (`sampling.seed: 3`) beside the same key in its section (`sampling:
    {seed: 4}`) is a key given twice, which YAML's loader cannot see: one would be lost. So is a
    key beside another name for it (`model: a.gguf` beside `model: {path: b.gguf}`)."""
    twice = next((key for key in more if key in flat), None)
    if twice is not None:
        raise ConfigError(f"{source}: key '{twice}' given twice, once written with its dot and once in its section")
    named = {_TARGET.get(key, key): key for key in flat}
    for key in more:
        other = named.get(_TARGET.get(key, key))
        if other is not None:
            raise ConfigError(f"{source}: '{other}' and '{key}' both set the same setting: give one of them")


# section -> its key that a plain value given to the section most likely meant (`answer: A,B`
# after the command line's --choices A,B)
SECTION_VALUE_MEANT = {"answer": "choices", "prompt": "template", "reasoning": "max_tokens"}


def _not_a_mapping(source: str, section: str, value: Any) -> ConfigError:
    """`answer: A,B`: the section's keys, and the likely one, spelt as YAML the user can paste."""
    keys = ", ".join(k[len(section) + 1:] for k in SCHEMA if k.startswith(section + "."))
    meant = SECTION_VALUE_MEANT.get(section)
    hint = ""
    if meant is not None and not isinstance(value, (Mapping, bool)):
        pasted = yaml.safe_dump({meant: value}, default_flow_style=True, width=10**6, allow_unicode=True).strip()
        hint = f" (did you mean {section}: {pasted if len(pasted) <= 80 else '{' + meant + ': ...}'}?)"
    return ConfigError(f"{source}: {section}: must be a mapping of its keys ({keys}), got {quote(value)}{hint}")


def _key_hint(key: str, prefix: str) -> str:
    """A key of another section (`n` for sampling.n) is named with its place; else the closest
    key of this level, if one is close."""
    if "." in key and not prefix:
        return _dotted_hint(key)
    elsewhere = [k for k in SCHEMA if k.rsplit(".", 1)[-1] == key and k != prefix + key]
    if elsewhere:
        place, _, _ = elsewhere[0].rpartition(".")
        return f" (did you mean '{elsewhere[0]}'? write it {f'under {place}:' if place else 'at the top level'})"
    known = [k[len(prefix):] for k in SCHEMA if k.startswith(prefix) and "." not in k[len(prefix):]]
    known += [s for s in SECTIONS if not prefix and s not in known]
    hint = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{hint[0]}'?)" if hint else ""


def _dotted_hint(key: str) -> str:
    """A key written with its dot (`sampling.tmperature: 0`), named back in that spelling: its name
    under another section (`samplng.temperature`, `answer.temperature`: 'sampling.temperature'),
    else the closest dotted key. The level-by-level search finds nothing for it: no top-level key
    is close to a name with a section in it."""
    leaf = key.rsplit(".", 1)[-1]
    elsewhere = [k for k in SCHEMA if k.rsplit(".", 1)[-1] == leaf]
    hint = elsewhere or difflib.get_close_matches(key, [k for k in SCHEMA if "." in k], n=1)
    return f" (did you mean '{hint[0]}'?)" if hint else ""


class JobFileLayer(dict[str, Any]):
    """A layer read from a job file (load_job_file): its keys' errors between keys name the file,
    a layer of flags or keywords' do not (each key's own error names its source either way)."""


def load_job_file(path: str) -> dict[str, Any]:
    """Read a YAML job file into flat dotted keys, paths made relative to the file's folder."""
    p = Path(path)
    data = read_job_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: a job file must be a mapping of keys to values")
    flat = flatten(data, str(path))
    base = p.resolve().parent
    for key in PATH_KEYS:
        value = flat.get(key)
        if isinstance(value, str) and value != "demo" and not _not_a_path(key, value):
            flat[key] = _job_path(key, value, base)
    return JobFileLayer(flat)


def _job_path(key: str, value: str, base: Path) -> str:
    """A path key's value as the run reads it: `~` expanded for every key (input's and output's were
    not), a relative path made the job folder's."""
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded  # a string, not a Path: a trailing separator stays, refused later as a folder's name
    if key.startswith("model") and is_hub_name(value) and not (base / value).exists():
        return value  # a Hugging Face model name (runner/model/hub.py), not a path beside the job file
    return str(base / value)


STREAM_KEYS = ("input", "output", "report", "errors_output")  # where `-` is standard input or output


def _not_a_path(key: str, value: str) -> bool:
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


def build_config(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> JobConfig:
    """Apply flat key/value layers in order (later wins) over the defaults, checking each value.
    Each layer is (source name for errors, {dotted key: value})."""
    values: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    from_files: dict[str, str] = {}
    for source, layer in layers:
        for key, raw in layer.items():
            _note_file(from_files, key, source if isinstance(layer, JobFileLayer) else None)
            if key not in SCHEMA:
                raise ConfigError(f"{source}: unknown key '{key}'")
            try:
                # a file's name may hold any bytes the system allows; a schema or grammar written
                # in the job file is text llama.cpp must read as UTF-8
                if key not in PATH_KEYS or not isinstance(raw, str) or _not_a_path(key, raw):
                    check.unicode_text(raw)
                value = SCHEMA[key](raw)
            except ValueError as exc:
                raise ConfigError(f"{source}: {key}: {exc}, got {quote(raw)}{_yaml_hint(source, raw)}") from None
            if key.startswith("sampling."):
                sampling[key.split(".", 1)[1]] = value
            else:
                values[_TARGET.get(key, key)] = value
    config = replace(JobConfig(), **values, sampling=SamplingParams(**sampling), from_files=from_files)
    for key in ("model", "input", "output"):
        if not getattr(config, key):
            raise _missing(key, layers)
    try:
        check_between_keys(config)
    except KeysError as exc:
        raise said_in_files(config, exc) from None
    return _shard_files(_scoring_defaults(config))


def _note_file(from_files: dict[str, str], key: str, job_file: Optional[str]) -> None:
    """Where a setting now comes from, by the key that set it (model or model.path): a later
    layer of flags or keywords takes it from the file."""
    for written in [k for k in from_files if _TARGET.get(k, k) == _TARGET.get(key, key)]:
        del from_files[written]
    if job_file is not None:
        from_files[key] = job_file


def set_in_file(config: JobConfig, key: str) -> Optional[tuple[str, str]]:
    """(the job file, the key as it wrote it) that set the setting `key` names (`model` is set by
    model or model.path), or None where flags or keywords set it, or nothing did."""
    target = _TARGET.get(key, key)
    return next(((file, written) for written, file in config.from_files.items()
                 if _TARGET.get(written, written) == target), None)


@contextmanager
def model_said_in_file(config: JobConfig) -> Iterator[None]:
    """The model's refusals (a missing file, not a GGUF, a Hub name that cannot be resolved) named
    after the job file and key that gave the model, as a key's own error is: they begin with the
    path, and read as the --model flag's would. Unchanged where a flag or keyword gave it."""
    try:
        yield
    except ModelError as exc:
        where = set_in_file(config, "model")
        if where is None:
            raise
        raise ModelError(f"{where[0]}: {where[1]}: {exc}") from None


@contextmanager
def key_said_in_file(config: JobConfig) -> Iterator[None]:
    """A key's refusal found only as its value is used (a JSON schema no grammar comes from, a
    grammar llama.cpp refuses, a template that does not parse) begins with the key: named after
    the job file that set it, as a key's own error is (`job.yaml: answer.json_schema: ...`).
    Unchanged where a flag or keyword set it."""
    try:
        yield
    except ConfigError as exc:
        key, _, rest = str(exc).partition(": ")
        where = set_in_file(config, key) if type(exc) is ConfigError and rest else None
        if where is None:
            raise
        raise ConfigError(f"{where[0]}: {where[1]}: {rest}") from None


@contextmanager
def key_said_by_call(source: str, given: Mapping[str, Any]) -> Iterator[None]:
    """key_said_in_file's rule for a key a function's keyword set (`given`: its layer's keys), so
    that such a refusal names the call as the call's other keyword errors do:
    `ggbatch.run(): answer.grammar: ...`. Unchanged where a job file set the key (named already).
    `ggbatch tune job.yaml` names its job file by it: its settings are that file's alone."""
    try:
        yield
    except ConfigError as exc:
        key, _, rest = str(exc).partition(": ")
        keywords = {_TARGET.get(k, k) for k in given}
        if type(exc) is not ConfigError or not rest or _TARGET.get(key, key) not in keywords:
            raise
        raise ConfigError(f"{source}: {exc}") from None


def said_in_files(config: JobConfig, error: KeysError) -> ConfigError:
    """The error between keys named after the job file that set the key it begins with
    (`j.yaml: ray_address: ...`), as a key's own error is; the other keys a file set said after
    it (`sampling.n: 3 samples with ... (answer.choice_scoring from j.yaml)`, n a flag's);
    unchanged where none came from a file."""
    sources = {key: (set_in_file(config, key) or (None,))[0] for key in error.keys}
    first = sources.get(error.keys[0]) if error.keys else None
    if first is not None:
        return ConfigError(f"{first}: {error}")
    others = "; ".join(f"{key} from {source}" for key, source in sources.items() if source is not None)
    return ConfigError(f"{error} ({others})") if others else error


def _missing(key: str, layers: Sequence[tuple[str, Mapping[str, Any]]]) -> ConfigError:
    """A required setting no layer gave, and how to give it: a flag on the command line, the
    keyword of a function (`ggbatch.run()`: it has no flags), named as its other errors are."""
    call = layers[-1][0] if layers and layers[-1][0].endswith("()") else None
    how = f"{key}=" if call else f"--{key}"
    return ConfigError(f"{call + ': ' if call else ''}missing required setting '{key}' "
                       f"(give it in {_job_file(layers)} or as {how})")


def _job_file(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The job file, named: a run's (and ggbatch.run()'s) first layer, its flags or keywords after it."""
    if len(layers) < 2:
        return "the job file"
    path, keys = layers[0]
    return f"the job file {path}{', which is empty,' if not keys else ''}"


def _yaml_hint(source: str, raw: Any) -> str:
    """YAML reads yes, no, on and off as true and false: a refused value holding a boolean from a
    job file was likely written as one of those words."""
    values = raw if isinstance(raw, list) else [raw]
    if Path(source).suffix.lower() in (".yaml", ".yml") and any(isinstance(v, bool) for v in values):
        return " (YAML reads yes, no, on and off as true and false: quote them, as 'yes', to mean the words)"
    return ""


def flash_attn_auto(choice_scoring: str) -> Optional[bool]:
    """What flash_attn: auto is for a job: off for log-likelihood scoring (llama.cpp's CPU flash
    attention moves a log-likelihood by up to about 0.01 nats a token: it rounds K and V to F16),
    llama.cpp's own choice (AUTO) otherwise."""
    return False if choice_scoring == LOGLIKELIHOOD else AUTO


def _scoring_defaults(config: JobConfig) -> JobConfig:
    if config.flash_attn is AUTO:
        return replace(config, flash_attn=flash_attn_auto(config.choice_scoring))
    return config


def _shard_files(config: JobConfig) -> JobConfig:
    """A shard writes files of its own (answers.shard-2-of-8.jsonl, and its journal beside it), so
    every task of a job array can run the same job file."""
    if config.shard is None:
        return config
    for role, path in ((OUTPUT, config.output), (REPORT, config.report), (ERRORS_OUTPUT, config.errors_output)):
        if path:
            # `-`, /dev/stdout or `out/` renamed after the shard (`-.shard-0-of-2`, out.shard-0-of-2)
            # would pass as a plain file's name: the path as given is what is refused
            check_not_a_stream(path)
            check_file_name(path, role)
    shard = config.shard
    return replace(config, output=config.output and shard_path(config.output, shard),
                   report=config.report and shard_path(config.report, shard),
                   errors_output=config.errors_output and shard_path(config.errors_output, shard))
