"""Why llama.cpp could not load a model, in one line a user can act on. No llama.cpp here.

llama_model_load_from_file returns NULL for every failure; the reason only appears in the
error lines llama.cpp logs on the way out (model_runner keeps them in a small ring buffer). For
example, from the llama.cpp build in llama-cpp-python 0.3.36:

    not enough memory  llama_model_load: error loading model: mmap failed: Cannot allocate memory
                       llama_model_load: error loading model: std::bad_alloc
    unknown arch       llama_model_load: error loading model: unknown model architecture: 'x'
    truncated          llama_model_load: error loading model: tensor 'token_embd.weight' data is not
                       within the file bounds, model is corrupted or incomplete
                       gguf_init_from_reader: failed to read key-value pairs
    unreadable         gguf_init_from_file: failed to open GGUF file 'm.gguf' (Permission denied)

each followed by the uninformative "llama_model_loader: failed to load model from m.gguf" and
"llama_model_load_from_file_impl: failed to load model".
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from ..limits import address_space_limit, under_address_space_limit

_MEMORY = re.compile(r"Cannot allocate memory|bad_alloc|failed to allocate|unable to allocate|"
                     r"out of memory|MemoryError|Memory allocation", re.IGNORECASE)
# The dynamic loader's words for a library it could not map (an import of numpy's extensions),
# and CPython's for a C call that failed without saying why (an allocation inside an import, which
# sets no MemoryError): under an address-space limit, the limit ran out; without one, the first
# may be a noexec mount or a bad file, the second any C extension's fault.
_MAP_FAILED = re.compile(r"failed to map segment from shared object|SystemError: error return without exception set")
_ARCH = re.compile(r"unknown model architecture: '([^']*)'")
_OPEN = re.compile(r"failed to open .*\((.+)\)$|failed to open [^:]+: (.+)$")
_CORRUPT = re.compile(r"not within the file bounds|corrupted or incomplete|failed to read|"
                      r"end of file|invalid magic|misaligned|tensor data is not|wrong number of tensors",
                      re.IGNORECASE)
# Lines every failure ends with: they say that it failed, not why.
_GENERIC = re.compile(r"failed to load model( from .*)?$")
_PREFIX = re.compile(r"^(?:\w+: |error loading model(?: \w+)*: )")


class ModelLoadError(Exception):
    """The GGUF file, or a context for it, could not be made by llama.cpp: the model or the
    machine, so every worker would fail the same way (WorkerError.model_load)."""


def says_memory(text: str) -> bool:
    """Whether an error text is about memory (llama.cpp's, the C++ runtime's or the OS's words)."""
    return memory_sign(text) is not None


def memory_sign(text: str) -> Optional[str]:
    """The words in an error text that say memory ran out ("MemoryError", "std::bad_alloc"), or None."""
    found = _MEMORY.search(text) or (_MAP_FAILED.search(text) if address_space_limit() is not None else None)
    return found.group(0) if found else None


def reasons(lines: Sequence[str]) -> list[str]:
    """The informative part of each logged error line, without function-name prefixes."""
    out = []
    for line in lines:
        text = line.strip()
        while (stripped := _PREFIX.sub("", text, count=1)) != text:
            text = stripped
        if text and not _GENERIC.match(text):
            out.append(text)
    return out


def describe_load_failure(path: str, log_lines: Sequence[str], version: str = "") -> str:
    """One line saying why loading `path` failed: memory, an unknown architecture, an unreadable
    or truncated file; else llama.cpp's own reasons."""
    found = reasons(log_lines)
    text = "; ".join(found)
    if _first(_MEMORY, found):
        return f"not enough memory to load {path} ({text}){under_address_space_limit()}"
    arch = _first(_ARCH, found)
    if arch:
        build = f" (llama-cpp-python {version})" if version else ""
        return (f"{path}: model architecture '{arch.group(1)}' is unknown to this llama.cpp build{build}; "
                "a newer llama-cpp-python may know it")
    opened = _first(_OPEN, found)
    if opened:
        return f"{path}: cannot open the model file ({opened.group(1) or opened.group(2)})"
    if _first(_CORRUPT, found):
        return f"{path}: the model file is truncated or corrupt ({text})"
    if found:
        return f"{path}: llama.cpp could not load this model ({text})"
    return (f"{path}: llama.cpp could not load this model (not a GGUF file, truncated, or an "
            "architecture this llama.cpp build does not know)")


def describe_context_failure(path: str, n_ctx: int, n_seq_max: int, log_lines: Sequence[str]) -> str:
    """One line saying why llama_init_from_model failed (the KV cache or compute buffers)."""
    found = reasons(log_lines)
    what = f"a context of {n_ctx} tokens for {n_seq_max} sequence{'' if n_seq_max == 1 else 's'} on {path}"
    if _first(_MEMORY, found):
        return f"not enough memory to create {what} ({'; '.join(found)}){under_address_space_limit()}"
    return f"could not create {what}" + (f" ({'; '.join(found)})" if found else "")


def _first(pattern: re.Pattern[str], found: Sequence[str]) -> Optional[re.Match[str]]:
    return next((m for m in map(pattern.search, found) if m), None)
