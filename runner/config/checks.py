"""The check of one job key's value: each takes the value as given (YAML, a flag's text, a
keyword argument) and returns it converted, or raises ValueError("must be ...") which
runner/config/schema.py turns into `SOURCE: KEY: must be ..., got VALUE`. Pure, and no key names here:
runner/config/keys.py's SCHEMA says which check each key takes.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union, cast

from ..errors import half_surrogate
from ..files.shards import Shard, parse_shard

AUTO = None  # "auto" in a job file or on the command line is stored as None
CHOICES_AUTO = "auto"  # answer.choices: auto, each record's own `choices`
# answer.choice_scoring: the choice the model is most likely to write first (from the logits, or
# generated under the choices' grammar), or each choice's log-likelihood as a continuation (lm-eval's)
FIRST_TOKEN, LOGLIKELIHOOD = "first_token", "loglikelihood"
INT32_MAX = 2**31 - 1  # llama.cpp's counts and sizes are 32-bit ints

GPU_ALL = -1  # llama.h: a negative n_gpu_layers stores every layer (and the output layer) in VRAM


def integer(lo: int, allow_auto: bool = False, hi: int = INT32_MAX,
            why_hi: str = "") -> Callable[[Any], Optional[int]]:
    def check(v: Any) -> Optional[int]:
        if allow_auto and v == "auto":
            return AUTO
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            if len(v.strip()) > 20:  # past every bound, and int() of thousands of digits is refused or slow
                raise ValueError(f"must be >= {lo}" if v.strip().startswith("-") else f"must be <= {hi}{why_hi}")
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"must be an integer{' or auto' if allow_auto else ''}")
        if v < lo:
            raise ValueError(f"must be >= {lo}")
        if v > hi:
            raise ValueError(f"must be <= {hi}{why_hi}")
        return v
    return check


def number(lo: float, hi: float = float("inf"), lo_open: bool = False) -> Callable[[Any], float]:
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


def string(optional: bool = False) -> Callable[[Any], Optional[str]]:
    def check(v: Any) -> Optional[str]:
        if v is None and optional:
            return None
        if not isinstance(v, str) or (not optional and not v):
            raise ValueError("must be a non-empty string" if not optional else "must be a string")
        return v
    return check


def path(optional: bool = False) -> Callable[[Any], Optional[str]]:
    """A job's file (input, output, report, errors_output), `~` expanded as the model's, the
    schema's and the grammar's are where they are read, whichever layer gave it (a job file's
    `~/q.jsonl`, `--output=~/a.json` the shell leaves alone, a keyword's)."""
    text = string(optional)

    def check(v: Any) -> Optional[str]:
        if v == "":  # optional means it may be left out, not given empty: "" was taken, then no file written
            raise ValueError("must be a non-empty string")
        v = text(v)
        return None if v is None else os.path.expanduser(v)
    return check


def unicode_text(v: Any) -> None:
    """ValueError for a string, in the value or in a list or mapping inside it, holding a lone
    surrogate: YAML's and JSON's escape "\\ud800" writes one, and a command-line argument holds one
    for each byte that is not UTF-8 (Python's surrogateescape). No UTF-8 text, a prompt included,
    can hold it: a system prompt with one failed every question at tokenization."""
    if isinstance(v, Mapping):
        for item in (*v.keys(), *v.values()):
            unicode_text(item)
    elif isinstance(v, (list, tuple)):
        for item in v:
            unicode_text(item)
    elif isinstance(v, str) and (why := half_surrogate(v)):
        point = next(ord(c) for c in v if 0xD800 <= ord(c) <= 0xDFFF)
        byte = f" (in a command-line argument, the byte 0x{point - 0xDC00:02x}, which is not UTF-8)" \
            if 0xDC80 <= point <= 0xDCFF else ""
        raise ValueError(f"{why}{byte}: must be text UTF-8 can write")


def boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        raise ValueError("must be true or false (a quoted string here: write it without quotes)")
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


def one_of(*choices: str) -> Callable[[Any], Optional[str]]:
    def check(v: Any) -> Optional[str]:
        if v == "auto":
            return AUTO
        if v not in choices:
            raise ValueError(f"must be auto, {', '.join(choices[:-1])} or {choices[-1]}")
        return str(v)
    return check


def auto_or_off(v: Any) -> str:
    """auto or off; YAML reads a bare `off` as false (and `on` as true)."""
    if isinstance(v, bool):
        return "auto" if v else "off"
    if v not in ("auto", "off"):
        raise ValueError("must be auto or off")
    return str(v)


def mapping(v: Any) -> dict[str, Any]:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise ValueError("must be a mapping of names to values")
    return dict(v)


# The variables ggbatch gives every chat template itself (runner/questions/prompts.py render_messages)
TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now")


def template_kwargs(v: Any) -> dict[str, Any]:
    """Extra chat template variables: one of TEMPLATE_VARIABLES would be given twice, which Jinja
    cannot take (a Python traceback mid-run), so it is refused with the job."""
    kwargs = mapping(v)
    taken = [name for name in kwargs if name in TEMPLATE_VARIABLES]
    if taken:
        raise ValueError(f"must not set {', '.join(taken)}: ggbatch sets {'it' if len(taken) == 1 else 'them'} "
                         f"for every prompt (it sets {', '.join(TEMPLATE_VARIABLES)})")
    return kwargs


def gpu_layers(v: Any) -> Optional[int]:
    """A layer count, `all` (as llama.cpp's -ngl all) or `auto`."""
    if v == "all":
        return GPU_ALL
    try:
        return integer(0, allow_auto=True)(v)
    except ValueError:
        raise ValueError("must be an integer >= 0, all or auto") from None


def devices(v: Any) -> tuple[int, ...]:
    """GPU numbers: `0,1` or a list [0, 1]; none (an empty list) is no GPU worker layout."""
    items: Any = [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v
    if isinstance(items, int) and not isinstance(items, bool):
        items = [items]
    gpu = integer(0)  # without allow_auto it never answers None
    try:
        devices = tuple(cast(int, gpu(x)) for x in items)
    except (TypeError, ValueError):
        raise ValueError("must be GPU numbers, as 0,1 or a list") from None
    if len(set(devices)) != len(devices):
        raise ValueError("must name each GPU once")
    return devices


def shard(v: Any) -> Optional[Shard]:
    """`I/N`, or `auto`: this task's shard of a Slurm job array (read from its variables here)."""
    return None if v is None else parse_shard(v, os.environ)


def backend(v: Any) -> str:
    if v not in ("local", "ray"):
        raise ValueError("must be local or ray")
    return str(v)


def ray_address(v: Any) -> Optional[str]:
    """auto (the cluster this machine belongs to) or HOST:PORT, a Ray head's GCS address."""
    if v is None:
        return None
    if isinstance(v, str) and v.startswith("ray://"):  # its host:port would pass the check below
        raise ValueError("is a Ray Client (ray://) address, which ggbatch does not join: give the head's "
                         "HOST:PORT (its GCS address, as `ray start --head` prints it)")
    if not isinstance(v, str) or not (v == "auto" or (":" in v and v.rpartition(":")[2].isdigit()
                                                     and v.rpartition(":")[0])):
        raise ValueError("must be auto or HOST:PORT (a Ray head's address, as `ray start --head` prints it)"
                         + (OWN_RAY if v == "none" else ""))
    return v


# `none` is no value: leaving the key out is how a job gets a Ray instance of its own (ray.md)
OWN_RAY = "; for a Ray instance of the job's own on this machine leave ray_address (--ray-address) out"


def stop(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise ValueError("must be a list of non-empty strings")
    return tuple(v)


def choices(v: Any) -> Union[tuple[str, ...], str]:
    """`A,B,C,D`, a list, or auto (each record's `choices`)."""
    if v == CHOICES_AUTO:
        return CHOICES_AUTO
    items = [x.strip() for x in v.split(",")] if isinstance(v, str) else v
    if not isinstance(items, list) or len(items) < 2 or not all(isinstance(c, str) and c for c in items):
        raise ValueError("must be two or more non-empty strings (A,B,C,D or a list), or auto")
    if len(set(items)) != len(items):
        raise ValueError("must name each choice once")
    return tuple(items)


def choice_scoring(v: Any) -> str:
    if v not in (FIRST_TOKEN, LOGLIKELIHOOD):
        raise ValueError(f"must be {FIRST_TOKEN} or {LOGLIKELIHOOD}")
    return str(v)


SCHEMA_FORMS = "a JSON Schema object ({\"type\": ...}), or the path of a .json file holding one"


def json_schema(v: Any) -> str:
    """A schema (a mapping, or its JSON text) or the path of a .json file holding one; kept as
    canonical JSON text (sorted keys), which the journal fingerprints."""
    if isinstance(v, str) and not v.lstrip().startswith("{"):
        v = _schema_file(v)
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as exc:
            raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(v, Mapping):
        raise ValueError(f"must be {SCHEMA_FORMS}")
    # JSON's escape "\ud800" writes a lone surrogate into ASCII text: the grammar would answer its
    # bytes, which no JSON reader reads back as the schema's string
    unicode_text(v)
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _schema_file(v: str) -> Any:
    """The text of the schema file `v` names; JSON that is no object (true, [1]) is returned as
    read, for the caller to refuse as no schema, not as no file."""
    path = Path(v).expanduser()
    if not path.exists():
        try:
            return json.loads(v)
        except ValueError:
            raise ValueError(f"no such file (expected {SCHEMA_FORMS})") from None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the schema file ({getattr(exc, 'strerror', None) or exc})") from None


GRAMMAR_WANTED = "GBNF text with a `root` rule (root ::= ...), or the path of a .gbnf file holding it"
ROOT_RULE = re.compile(r"^[ \t]*root[ \t]*::=", re.MULTILINE)


def is_grammar_text(v: str) -> bool:
    """GBNF text has rules (`name ::= ...`); anything else given as a grammar is a file's path."""
    return "::=" in v


def grammar(v: Any) -> str:
    """GBNF text, or the path of a file holding it; the text, with the `root` rule llama.cpp
    starts from (llama.cpp itself only says it cannot parse a grammar without one)."""
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"must be {GRAMMAR_WANTED}")
    if not is_grammar_text(v):
        path = Path(v).expanduser()
        if not path.is_file():
            raise ValueError(f"no such file (a grammar is {GRAMMAR_WANTED})")
        try:
            v = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the grammar file ({getattr(exc, 'strerror', None) or exc})") from None
    gbnf_escapes(v)
    if not ROOT_RULE.search(v):
        raise ValueError("has no `root` rule: an answer is what `root` matches (root ::= ...)")
    return str(v)


# GBNF's literals ("..." and [...]) and comments; llama.cpp's parser reads \uXXXX and \UXXXXXXXX
# in a literal as a code point, and writes whatever it names as UTF-8 bytes
GBNF_LITERAL = re.compile(r'#[^\n]*|"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]', re.DOTALL)
GBNF_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|.)", re.DOTALL)


def gbnf_escapes(text: str) -> None:
    """ValueError for a GBNF escape naming no character (a surrogate's half, or past U+10FFFF):
    the grammar would make the model write bytes that are not UTF-8."""
    for literal in GBNF_LITERAL.finditer(text):
        if literal.group().startswith("#"):
            continue
        for escape in GBNF_ESCAPE.finditer(literal.group()):
            digits = escape.group(1) or escape.group(2)
            point = int(digits, 16) if digits else 0
            why = "is half of a surrogate pair" if 0xD800 <= point <= 0xDFFF else \
                "is past the last code point, U+10FFFF" if point > 0x10FFFF else None
            if why is not None:
                raise ValueError(f"the escape {escape.group()} at character {literal.start() + escape.start() + 1} "
                                 f"names U+{point:04X}, which {why}: must be text UTF-8 can write")
