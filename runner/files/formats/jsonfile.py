"""JSON question files (an array, or JSON Lines) and JSON answers files, with line numbers for
every error.

A key written twice in one object is refused, naming it: json would keep the last one silently,
so `{"questionID": "a", ..., "questionID": "b"}` would be answered as b and a lost. So are NaN,
Infinity and -Infinity, which are not JSON though json takes them, and a number too large for a
float (1e999): each would reach a prompt as "nan" or "inf" (docs/guide/nothing-lost.md: numbers
must be finite). Answers files ggbatch wrote itself are read with finite=False: json.dumps spells
a logprob of -inf -Infinity. An integer longer than Python reads (4300 digits) is refused at its
line too, where it was a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterator

from ...errors import InputError, quote


class Refused(Exception):
    """Raised by the decoder's hooks, which know neither the file nor the line: the reader adds them."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # rare: only then is the key looked for
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise Refused(f"the record names key {quote(key)} twice")
            seen.add(key)
    return obj


FINITE = "numbers must be finite (nan and inf are refused)"


def _constant(name: str) -> Any:
    raise Refused(f"{name} is not a number JSON has; {FINITE}")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: valid JSON, but inf once read
        raise Refused(f"{text[:30]}{'...' if len(text) > 30 else ''} is too large for a number; {FINITE}")
    return value


# Made once: the hooks cost a call per object and per float, not a decoder per line.
DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
ANSWERS_DECODER = json.JSONDecoder(object_pairs_hook=_pairs)  # finite=False: -Infinity taken


def too_long_integer() -> str:
    """An integer longer than Python's int-string limit: the decoder's int() raises a plain ValueError,
    caught rather than hooked (a parse_int hook would cost a call per integer of every file)."""
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
    return f"an integer of more than {limit} digits is too long to read"


def loads(where: str, text: str, finite: bool = True) -> Any:
    """One line's value; `where` is "file:line", which every error starts with."""
    try:
        return (DECODER if finite else ANSWERS_DECODER).decode(text)
    except Refused as exc:
        raise InputError(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError:  # after JSONDecodeError, a ValueError itself
        raise InputError(f"{where}: {too_long_integer()}") from None


def json_lines(path: str, text: str, finite: bool = True) -> Iterator[tuple[int, Any]]:
    """(line, value) of each non-blank line; `finite`: NaN and inf refused (False: an answers file)."""
    # Split on "\n" only: str.splitlines() would also split on U+0085 and U+2028 inside strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, loads(f"{path}:{number}", line, finite)


def json_array(path: str, text: str, finite: bool = True) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array with the line each starts on."""
    if not text.strip():
        return
    i = _skip_ws(text, 0)
    if text[i] != "[":
        raise InputError(f"{path}: expected a JSON array")
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "]":
        return
    line, counted = 1, 0  # the line breaks before `counted`, counted on from there: not from 0 each time
    while True:
        line, counted = line + text.count("\n", counted, i), i
        obj, i = _element(path, text, i, line, finite)
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


def _element(path: str, text: str, i: int, line: int, finite: bool) -> tuple[Any, int]:
    """The array's element at `i` and where it ends; a refusal names the line the element starts on."""
    try:
        return (DECODER if finite else ANSWERS_DECODER).raw_decode(text, i)
    except Refused as exc:
        raise InputError(f"{path}:{line}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError:
        raise InputError(f"{path}:{line}: {too_long_integer()}") from None


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
