"""Job configuration: layers of dotted keys (a job file's, read by runner/config/job_file.py;
flags; keywords) checked against the one key table (runner/config/keys.py) and built into a
JobConfig, with errors that name the key and the file or call that set it.

Precedence: command-line flags > job file > defaults. Relative paths in a job file are relative
to the job file's folder; relative paths given as flags are relative to the current directory.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from ...workers.protocol import SamplingParams
from ..errors import ConfigError, KeysError, ModelError, quote
from ..files.paths import ERRORS_OUTPUT, OUTPUT, REPORT, check_file_name, check_not_a_stream
from ..files.shards import shard_path
from ..model.hub import hub_hint
from . import checks as check
from .between_keys import check_between_keys
from .checks import AUTO, CHOICES_AUTO, FIRST_TOKEN, LOGLIKELIHOOD
from .job_config import JobConfig
from .job_file import JobFileLayer
from .keys import PATH_KEYS, SCHEMA, TARGET, not_a_path

# What the rest of the runner takes from here; AUTO and CHOICES_AUTO (the values a JobConfig
# holds for `auto`) are the value checks', which produce them.
# The key table is runner/config/keys.py's, a job file's reading runner/config/job_file.py's.
__all__ = ["AUTO", "CHOICES_AUTO", "FIRST_TOKEN", "LOGLIKELIHOOD", "JobConfig", "build_config"]


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
                if key not in PATH_KEYS or not isinstance(raw, str) or not_a_path(key, raw):
                    check.unicode_text(raw)
                value = SCHEMA[key](raw)
            except ValueError as exc:
                raise ConfigError(f"{source}: {key}: {exc}, got {quote(raw)}{_yaml_hint(source, raw)}") from None
            if key.startswith("sampling."):
                sampling[key.split(".", 1)[1]] = value
            else:
                values[TARGET.get(key, key)] = value
    config = replace(JobConfig(), **values, sampling=SamplingParams(**sampling), from_files=from_files)
    for key in ("model", "input", "output"):
        if not getattr(config, key):
            raise _missing(key, layers)
    try:
        check_between_keys(config)
    except KeysError as exc:
        raise said_in_files(config, exc, _call(layers)) from None
    return _shard_files(_scoring_defaults(config))


def _note_file(from_files: dict[str, str], key: str, job_file: Optional[str]) -> None:
    """Where a setting now comes from, by the key that set it (model or model.path): a later
    layer of flags or keywords takes it from the file."""
    for written in [k for k in from_files if TARGET.get(k, k) == TARGET.get(key, key)]:
        del from_files[written]
    if job_file is not None:
        from_files[key] = job_file


def set_in_file(config: JobConfig, key: str) -> Optional[tuple[str, str]]:
    """(the job file, the key as it wrote it) that set the setting `key` names (`model` is set by
    model or model.path), or None where flags or keywords set it, or nothing did."""
    target = TARGET.get(key, key)
    return next(((file, written) for written, file in config.from_files.items()
                 if TARGET.get(written, written) == target), None)


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
        raise model_refused_in_file(where[0], where[1], config.model, exc) from None


def model_refused_in_file(job_file: str, key: str, model: str, error: ModelError) -> ModelError:
    """The model's refusal named after the job file and key that gave it, with hub_hint for the
    model as the file wrote it: a bare OWNER/REPO (`Qwen/Qwen2-GGUF`) was joined to the file's
    folder (runner/config/job_file.py), so the path alone no longer reads as one."""
    written = os.path.relpath(model, Path(job_file).resolve().parent)
    hint = "" if os.path.exists(model) else hub_hint(written)
    return ModelError(f"{job_file}: {key}: {error}{hint}")


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
        keywords = {TARGET.get(k, k) for k in given}
        if type(exc) is not ConfigError or not rest or TARGET.get(key, key) not in keywords:
            raise
        raise ConfigError(f"{source}: {exc}") from None


def said_in_files(config: JobConfig, error: KeysError, call: Optional[str] = None) -> ConfigError:
    """The error between keys named after the job file that set the key it begins with
    (`j.yaml: ray_address: ...`), as a key's own error is; the other keys a file set said after
    it (`sampling.n: 3 samples with ... (answer.choice_scoring from j.yaml)`, n a flag's). Where
    no file set the first key, named after the function whose keywords did (`call`:
    `ggbatch.answer()`), else unchanged (a flag's)."""
    sources = {key: (set_in_file(config, key) or (None,))[0] for key in error.keys}
    first = sources.get(error.keys[0]) if error.keys else None
    if first is not None:
        return ConfigError(f"{first}: {error}")
    others = "; ".join(f"{key} from {source}" for key, source in sources.items() if source is not None)
    said = f"{call}: {error}" if call else str(error)
    return ConfigError(f"{said} ({others})") if others else ConfigError(said) if call else error


def _call(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> Optional[str]:
    """The function whose keywords are the last layer (`ggbatch.run()`), or None (flags, files)."""
    return layers[-1][0] if layers and layers[-1][0].endswith("()") else None


def _missing(key: str, layers: Sequence[tuple[str, Mapping[str, Any]]]) -> ConfigError:
    """A required setting no layer gave, and how to give it: a flag on the command line, the
    keyword of a function (`ggbatch.run()`: it has no flags), named as its other errors are."""
    call = _call(layers)
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
