"""Which format a question file or an answers file is: as the job says (input_format,
output_format), else by the file's extension, checked against its content. Errors name the file
and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ...errors import InputError

JSONL_SUFFIXES = {".jsonl", ".ndjson"}
CSV_SUFFIXES = {".csv"}


# how each format is named in a message, and the extension that says it
NAMED = {"json": ("a JSON array", ".json"), "jsonl": ("JSON Lines", ".jsonl"), "csv": ("CSV", ".csv")}
HOLDS = {"json": "a JSON array ([{...}, ...])", "jsonl": "one JSON object per line",
         "csv": "comma-separated rows under a header line"}


def detect_format(path: str, text: str, option: str = "", what: str = "question file") -> str:
    """'json', 'jsonl' or 'csv'. The extension decides, and must agree with the content; another
    extension: the content decides (an array, objects, else CSV). `option`: how the caller's
    user says a format outright (--input-format), suggested beside renaming."""
    suffix = Path(path).suffix.lower()
    starts = text.lstrip()[:1]
    by_name = ("csv" if suffix in CSV_SUFFIXES else "json" if suffix == ".json" else
               "jsonl" if suffix in JSONL_SUFFIXES else None)
    if by_name is None:
        return {"[": "json", "{": "jsonl", "": "jsonl"}.get(starts, "csv")
    looks = content_format(text)
    if by_name == "json" and starts and starts != "[" and looks != "csv":
        raise InputError(f"{path}: a .json {what} must hold a JSON array "
                         "([{...}, ...]); for one object per line name it .jsonl")
    if looks is not None and looks != by_name:
        name, extension = NAMED[looks]
        raise InputError(f"{path}:1: a {suffix} file holds {HOLDS[by_name]}, but this looks like {name}; name it "
                         f"{extension}{f' (or give {option} {looks})' if option else ''}")
    return by_name


def content_format(text: str) -> Optional[str]:
    """What the start of a file clearly is, whatever its name: 'json' (an array),
    'jsonl' (a JSON object on its first line) or 'csv' (a first line that is no JSON and has
    commas); None when that is not clear (the reader then names what is wrong, and where)."""
    body = text.lstrip()
    first = body.split("\n", 1)[0].strip()
    if body.startswith("["):
        return "json"
    try:
        obj = json.loads(first)
    except ValueError:
        return "csv" if "," in first and not first.startswith(("{", "[")) else None
    return "jsonl" if isinstance(obj, dict) else None


def input_format(path: str, text: str, requested: Optional[str] = None) -> str:
    """The question file's format: `requested` (the job's input_format) if set; otherwise JSON
    Lines whose first line is an OpenAI Batch request ({"custom_id", "method", "url", "body"}) are
    'openai', and anything else is what detect_format says."""
    if requested is not None:
        return requested
    fmt = detect_format(path, text, "--input-format")
    return "openai" if fmt == "jsonl" and is_openai_request(_first_line(text)) else fmt


def output_format(path: str, requested: Optional[str], input_fmt: str) -> str:
    """The answers file's format: `requested` (the job's output_format) if set; otherwise `.csv`
    is CSV and `.json` a JSON array; lines (`.jsonl`, another extension) are OpenAI Batch output
    when the questions were an OpenAI Batch file, else `.jsonl` is JSON Lines and anything else a
    JSON array."""
    if requested is not None:
        return requested
    suffix = Path(path).suffix.lower()
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix == ".json":
        return "json"
    if input_fmt == "openai":
        return "openai"
    return "jsonl" if suffix in JSONL_SUFFIXES else "json"


def errors_format(path: str, output_fmt: str) -> str:
    """The errors file's format (errors_output): its own extension's, as a user names a file by
    the format they want (`.json` a JSON array, `.jsonl` lines, `.csv` CSV); lines of an OpenAI
    Batch job stay OpenAI Batch output, as OpenAI's error file is; another extension: the
    answers file's format."""
    suffix = Path(path).suffix.lower()
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix == ".json":
        return "json"
    if suffix in JSONL_SUFFIXES:
        return "openai" if output_fmt == "openai" else "jsonl"
    return output_fmt


def is_openai_request(line: str) -> bool:
    """Whether one line of JSON is an OpenAI Batch request (it has a custom_id and a body or url)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and "custom_id" in obj and ("body" in obj or "url" in obj)


def is_openai_output(obj: Any) -> bool:
    """Whether one line's object is an OpenAI Batch output line (its custom_id with a response or an
    error, and no request body): a batch's answers, ggbatch's or OpenAI's."""
    return isinstance(obj, dict) and "custom_id" in obj and "body" not in obj and ("response" in obj or "error" in obj)


def _first_line(text: str) -> str:
    for line in text.split("\n"):
        if line.strip():
            return line
    return ""
