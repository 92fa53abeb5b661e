"""The job's keys as keyword arguments of the Python API (ggbatch.run, ggbatch.answer,
ggbatch.Pool): nested (sampling={"temperature": 0.7}) or with dots spelled as double underscores
(sampling__temperature=0.7), checked as a job file's are, each error naming the function called."""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Optional

from ..errors import ConfigError
from .job_file import flatten, load_job_file
from .keys import SCHEMA, SECTIONS
from .schema import JobConfig, build_config


def job_config(job_file: Optional[str] = None, **settings: Any) -> JobConfig:
    """A checked job configuration: the job file's keys (if any), overridden by `settings`, which
    take the job file's keys as keyword arguments, nested (sampling={"temperature": 0.7}) or
    with dots spelled as double underscores (sampling__temperature=0.7)."""
    check_keywords("ggbatch.run()", settings, also=("fresh", "progress"))
    return settings_config(job_file, settings, "ggbatch.run()")


def settings_config(job_file: Optional[str], settings: Mapping[str, Any], source: str) -> JobConfig:
    """job_config, its errors said of `source` (the function the caller called)."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if job_file is not None:
        layers.append((job_file, load_job_file(job_file)))
    layers.append((source, settings_layer(settings, source)))
    return build_config(layers)


def settings_layer(settings: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Keyword arguments as a layer of dotted keys (build_config's), unknown keys refused. A name's
    double underscores (or dots: lm-eval's --model_args passes them) are the job file's nesting,
    so model="m.gguf" beside model__n_gpu_layers="all" is a job file's model: {path: m.gguf,
    n_gpu_layers: all}, in either order."""
    nested: dict[str, Any] = {}
    for key, value in settings.items():
        *sections, name = key_parts(key)
        target = nested
        for depth, section in enumerate(sections):
            if ".".join(sections[:depth + 1]) not in SECTIONS:
                raise ConfigError(f"{source}: unknown key '{key}': {section} holds no keys")
            target[section] = _as_section(target.get(section, {}), section, source)
            target = target[section]
        if ".".join([*sections, name]) in SECTIONS and isinstance(target.get(name), dict):
            value = {**target[name], **_as_section(value, name, source)}  # the section's own keys came first
        target[name] = value
    return flatten(nested, source)


def key_parts(name: str) -> list[str]:
    """A keyword argument's name as the job file's nested keys: sampling__seed, sampling.seed."""
    return name.replace(".", "__").split("__")


def _as_section(value: Any, section: str, source: str) -> Any:
    """A section's keys as a mapping; a plain value given for a section with a path (model="m.gguf")
    is that path."""
    if isinstance(value, Mapping):
        return dict(value)
    if f"{section}.path" in SCHEMA:
        return {"path": value}
    raise ConfigError(f"{source}: {section}={value!r} is not a mapping, yet keys inside {section} are given too")


def keywords() -> list[str]:
    """The keyword arguments run() and answer() take as settings: the job file's top-level keys."""
    return sorted({key.split(".")[0] for key in SCHEMA} | SECTIONS)


def check_keywords(source: str, settings: Mapping[str, Any], own: tuple[str, ...] = (),
                    also: tuple[str, ...] = ()) -> None:
    """A keyword argument that is no job key (or one of the function's `own`) is a GgbatchError
    naming it, with the valid ones (`also`: the function's other keyword arguments): Python's
    TypeError would point inside ggbatch."""
    valid = [k for k in keywords() if k not in own]
    for name in settings:
        top = key_parts(name)[0]
        if top in own:
            raise ConfigError(f"{source}: {name}= is not taken here: {source[:-2]} makes its own files "
                              "and returns the answers (use ggbatch.run() to write files)")
        if top not in valid:
            raise ConfigError(f"{source}: {unknown_key(name, [*valid, *also])}")


def unknown_key(name: str, valid: list[str]) -> str:
    """The words for a keyword argument that is none of `valid`: the one meant, where one is close
    (a job key inside a section first: n_gpu_layers -> model__n_gpu_layers), and the valid ones."""
    top = key_parts(name)[0]
    hint = _leaf_hint(top, 1.0) or difflib.get_close_matches(top, valid, n=1) or _leaf_hint(top)
    return (f"unknown key '{name}'" + (f" (did you mean '{hint[0]}'?)" if hint else "")
            + f"; the keyword arguments: {', '.join(sorted(valid))}")


def _leaf_hint(name: str, cutoff: float = 0.6) -> list[str]:
    """A job key inside a section whose own name is `name` or close to it (difflib's cutoff),
    spelt as a keyword argument: n_gpu_layers -> model__n_gpu_layers, temprature ->
    sampling__temperature."""
    inside = {key.split(".")[-1]: key for key in SCHEMA if "." in key}
    return [inside[leaf].replace(".", "__") for leaf in difflib.get_close_matches(name, inside, n=1, cutoff=cutoff)]
