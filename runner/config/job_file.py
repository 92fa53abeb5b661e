"""A YAML job file read into one layer of flat dotted keys: unknown keys refused with a hint, a key
given twice refused, relative paths made the job file's folder's (runner/config/schema.py builds
the config from the layers).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import ConfigError, quote
from ..files.paths import URL
from ..model.hub import is_hub_name
from .job_yaml import read_job_yaml
from .keys import LEAF_MAPPINGS, PATH_KEYS, SCHEMA, SECTIONS, TARGET, not_a_path


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
    named = {TARGET.get(key, key): key for key in flat}
    for key in more:
        other = named.get(TARGET.get(key, key))
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
        if isinstance(value, str) and value != "demo" and not not_a_path(key, value):
            flat[key] = _job_path(key, _with_variables(str(path), key, value), base)
    return JobFileLayer(flat)


# $NAME or ${NAME}, as a shell reads a variable's name
_VARIABLE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def _with_variables(source: str, key: str, value: str) -> str:
    """A path key's `$NAME` and `${NAME}` replaced by the environment's values, as a shell does in a
    flag: a cron job's file names `$MODELS/qwen.gguf`. A variable the environment lacks is an error
    naming it, not a file not found in a folder called `$MODELS`."""
    def value_of(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in os.environ:
            raise ConfigError(f"{source}: {key}: {value}: the environment has no variable {name} (set it, or write "
                              "the path out)")
        return os.environ[name]
    return _VARIABLE.sub(value_of, value)


def _job_path(key: str, value: str, base: Path) -> str:
    """A path key's value as the run reads it: `~` expanded for every key (input's and output's were
    not), a relative path made the job folder's."""
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded) or URL.match(value):  # a link is refused where it is read, as written
        return expanded  # a string, not a Path: a trailing separator stays, refused later as a folder's name
    if key.startswith("model") and is_hub_name(value) and not (base / value).exists():
        return value  # a Hugging Face model name (runner/model/hub.py), not a path beside the job file
    return str(base / value)
