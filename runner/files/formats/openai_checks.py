"""The checks of an OpenAI request body's values, shared by its endpoints (openai_request.py:
/v1/chat/completions and /v1/completions; openai_responses.py: /v1/responses), and of a
conversation, which a question file's record may hold as its question (runner/files/inputs.py).
Each check raises ValueError saying what the value must be; `body_value` turns that into a
Refused naming the body's key, which the line is answered with."""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

from ....workers.protocol import ResponseFormat
from ...errors import half_surrogate, quote

EFFORTS = ("none", "minimal", "low", "medium", "high")  # budgets: runner/config/reasoning.py
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SCHEMA_KEYS = {"name", "schema", "strict", "description"}
INT32_MAX = 2**31 - 1  # the most tokens a line may ask for


class Refused(ValueError):
    """Why a line cannot be answered as asked, naming the field."""


def body_value(body: Mapping[str, Any], key: str, check: Callable[[Any], Any], where: str = "body") -> Any:
    """The checked value of body[key]; None when absent or null (the job's setting)."""
    value = body.get(key)
    if value is None:
        return None
    try:
        return check(value)
    except ValueError as exc:
        raise Refused(f"{where}.{key}: {exc}, got {quote(value)}") from None


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def number(lo: float, hi: float, lo_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError("must be a number")
        if v < lo or (lo_open and v == lo) or v > hi:
            raise ValueError(f"must be {'>' if lo_open else '>='} {lo:g} and <= {hi:g}")
        return float(v)
    return check


def integer(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("must be an integer")
        if not lo <= v <= hi:
            raise ValueError(f"must be from {lo} to {hi}")
        return v
    return check


def effort(v: Any) -> str:
    if v not in EFFORTS:
        raise ValueError(f"must be one of {', '.join(EFFORTS)}")
    return str(v)


def schema_format(spec: Mapping[str, Any], where: str) -> ResponseFormat:
    """A json_schema response format from its name, schema, strict (and description); `where`
    names the object that holds them in errors (chat's `json_schema`, the Responses API's
    `format`)."""
    unknown = set(spec) - SCHEMA_KEYS
    name, schema, strict = spec.get("name"), spec.get("schema"), spec.get("strict")
    if unknown or not isinstance(name, str) or not name:
        raise ValueError(f"{where}: needs a name, and takes only name, schema, strict and description")
    if schema is not None and not isinstance(schema, dict):
        raise ValueError(f"{where}.schema: must be a JSON Schema object")
    if strict is not None and not isinstance(strict, bool):
        raise ValueError(f"{where}.strict: must be true or false")
    text = json.dumps(schema, sort_keys=True, separators=(",", ":")) if schema is not None else None
    return ResponseFormat("json_schema", text, name, bool(strict))


def messages(where: str, v: Any) -> tuple[tuple[str, str], ...]:
    """A conversation: (role, text) of each message, from a non-empty list of {role, content}
    (and name) objects, as chat lines and a question file's conversations hold them."""
    if not isinstance(v, list) or not v:
        raise Refused(f"{where}: must be a non-empty list of messages")
    return tuple(_message(f"{where}[{i}]", m) for i, m in enumerate(v))


def _message(where: str, m: Any) -> tuple[str, str]:
    if not isinstance(m, dict):
        raise Refused(f"{where}: must be an object with a role and a content")
    extra = {k for k, v in m.items() if v is not None} - {"role", "content", "name"}  # null: not given
    if extra:
        raise Refused(f"{where}.{sorted(extra)[0]}: not supported (tools and function calls are not)")
    return role(where, m.get("role")), text_parts(f"{where}.content", m.get("content"), ("text",))


def role(where: str, v: Any) -> str:
    """A message's role as the chat template takes it (developer as system)."""
    if v not in ROLES:
        raise Refused(f"{where}.role: must be one of {', '.join(ROLES)}, got {quote(v)}")
    return ROLES[v]


def text_parts(where: str, v: Any, kinds: tuple[str, ...]) -> str:
    """A message's text: a string, or text parts of these types (joined by line breaks)."""
    if isinstance(v, str):
        return utf8(where, v)
    if not isinstance(v, list) or not v:
        raise Refused(f"{where}: must be a string or a list of text parts")
    texts = []
    for i, part in enumerate(v):
        if not isinstance(part, dict) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise Refused(f"{where}[{i}]: only text parts are supported, got {quote(kind)}")
        texts.append(utf8(f"{where}[{i}].text", part["text"]))
    return "\n".join(texts)


def utf8(where: str, text: str) -> str:
    """The text, refused where it holds half of a surrogate pair (JSON's escape "\\ud800" writes
    one), which no tokenizer takes: named here, in the line's terms, not at a character of the
    prompt the chat template makes of it."""
    if why := half_surrogate(text):
        raise Refused(f"{where}: {why}: must be text UTF-8 can write")
    return text
