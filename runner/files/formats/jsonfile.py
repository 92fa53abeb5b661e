"""JSON question files (an array, or JSON Lines) and JSON answers files, with line numbers for
every error."""

from __future__ import annotations

import json
from typing import Any, Iterator

from ...errors import InputError


def json_lines(path: str, text: str) -> Iterator[tuple[int, Any]]:
    """(line, value) of each non-blank line."""
    # Split on "\n" only: str.splitlines() would also split on U+0085 and U+2028 inside strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: malformed JSON: {exc.msg} (column {exc.colno})") from None


def json_array(path: str, text: str) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array with the line each starts on."""
    if not text.strip():
        return
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if text[i] != "[":
        raise InputError(f"{path}: expected a JSON array")
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "]":
        return
    while True:
        line = text.count("\n", 0, i) + 1
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
        yield line, obj
        i = _skip_ws(text, i)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "]":
            if text[i + 1:].strip():
                raise InputError(f"{path}:{text.count(chr(10), 0, i) + 1}: unexpected text after the array")
            return
        at = text.count("\n", 0, i) + 1
        raise InputError(f"{path}:{at}: malformed JSON: expected ',' or ']' in the array")


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i

