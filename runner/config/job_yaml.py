"""A job file's text parsed as YAML, before its keys are checked (runner/config/job_file.py):
a file that is not a job file at all (a question file, a GGUF model given where the job file
goes) is named for what it is and the flag that takes it, and YAML's own errors name the file
and the line (and, for a character YAML refuses, the column).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, InputError, quote
from ..files.formats.jsonfile import too_long_integer
from ..files.formats.textfile import decoded_text
from ..files.paths import closest_file

# What a question file is named (runner/files/formats/detect.py); a `.json` one is an array,
# which no job file (a mapping) is.
QUESTION_SUFFIXES = {".jsonl": "JSON Lines", ".ndjson": "JSON Lines", ".csv": "CSV"}


def read_job_yaml(path: str) -> Any:
    """The YAML document of the job file at `path` (None: an empty one), or ConfigError."""
    text = _job_text(path)
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.reader.ReaderError as exc:  # a character YAML refuses: it has a position, no mark
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        raise ConfigError(f"{path}:{line}:{column}: character #x{exc.character:04x} "
                          f"({quote(chr(exc.character))}): {exc.reason}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        if "'\\t'" in problem:  # an editor's tab where YAML takes spaces alone
            problem += " (YAML indents with spaces, not tabs)"
        raise ConfigError(f"{path}{where}: {problem}") from None


def _job_text(path: str) -> str:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: job file not found{closest_file(path)}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read job file: {exc.strerror or exc}") from None
    if data.startswith(b"GGUF"):
        raise ConfigError(f"{path}: a GGUF model, not a job file (YAML): give it as --model")
    question_format = QUESTION_SUFFIXES.get(p.suffix.lower())
    if question_format is None and p.suffix.lower() == ".json" and data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"[":
        question_format = "a JSON array"
    if question_format is not None:
        raise ConfigError(f"{path}: looks like a question file ({question_format}), not a job file (YAML): "
                          "give it as --input")
    try:
        return decoded_text(path, data)  # question files' encodings, said in the same words
    except InputError as exc:
        raise ConfigError(str(exc)) from None


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last one
    silently: a setting written twice would lose one without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                line = first_line.get(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if line is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {quote(key)} (first on line {line})", key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def construct_long_int(self, node: yaml.ScalarNode) -> int:
        """An integer; one longer than Python's int-string limit is a YAML error at its line, not the
        plain ValueError int() raises, which read_job_yaml would let through as a traceback."""
        try:
            return int(super().construct_yaml_int(node))
        except ValueError:
            raise yaml.constructor.ConstructorError(None, None, too_long_integer(), node.start_mark) from None


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", UniqueKeyLoader.construct_long_int)
