"""Which model a job runs: the path it names, checked before anything starts, and the model's
identity, which decides whether a journal's answers may be reused and which `ggbatch tune`
layout applies.

Identity: a sha256 over each file of the model (every part of a split GGUF): its size, its whole
GGUF header (every metadata value, so the tokenizer, chat template and hyper-parameters; and the
tensor table, so every tensor's type, shape and place) and samples of the weights: the first and
a middle block of every tensor plus blocks spread evenly over the file. A re-quantization changes
the tensor table; a fine-tune or a merged adapter exported under the same name changes every
weight of the tensors it touches, so their sampled blocks. Reading that is a few MiB whatever
the model's size (measured: docs/guide/nothing-lost.md), where hashing a multi-GB file would take
longer than a small job.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ModelError
from ..files.paths import cache_refusal, closest_file, files_inside, url_hint
from .gguf_header import NO_MAGIC, GGUFFormatError, GGUFLayout, read_layout
from .hub import hub_hint, is_hub_name, model_parts, resolve_hub_name

BLOCK = 4096  # bytes sampled at each place
SPREAD_BLOCKS = 64  # evenly spaced samples over the whole file, besides two per tensor


@dataclass(frozen=True)
class ModelIdentity:
    path: str  # absolute
    size_bytes: int
    mtime: int
    digest: str  # sha256 over size, header and sampled weights (see the module docstring)

    def as_report(self) -> dict[str, object]:
        return {"path": self.path, "size_bytes": self.size_bytes, "mtime": self.mtime, "sha256_sampled": self.digest}


def resolve_model(model: str) -> str:
    """The GGUF path to load: `demo` builds (once) the project's own tiny model; a Hugging Face
    name (`hf:OWNER/REPO/FILE.gguf`, `OWNER/REPO:QUANT`) is the cached file. Refuses, in one
    line naming the path, what llama.cpp could not load. The path is absolute: a worker started
    again after the current folder changed (os.chdir in a pipeline, the folder removed) loads the
    same file."""
    if model == "demo":
        return _demo_model()
    model = resolve_hub_name(model)
    path = Path(model).expanduser()
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        said = hub_hint(model) or url_hint(model, "the model") or closest_file(model)
        raise ModelError(f"{model}: model file not found{said}") from None
    except IsADirectoryError:
        inside = files_inside(model, (".gguf",))
        raise ModelError(f"{model}: model path is a directory, not a GGUF file{inside}") from None
    except OSError as exc:
        raise ModelError(f"{model}: cannot read the model file ({exc.strerror or exc})") from None
    if magic != b"GGUF":
        raise ModelError(f"{model}: not a GGUF file ({NO_MAGIC})")
    return os.path.abspath(path)


def _demo_model() -> str:
    """The demo model's path, built into ggbatch's cache folder on first use; a folder that cannot
    be made or written (a HOME a cron user or a system account cannot write) is ModelError, one
    line naming it: the run asked nothing of the questions yet."""
    from .make.modelgen import ensure_demo_model  # numpy + gguf: only needed to build the demo model

    try:
        return str(ensure_demo_model())
    except OSError as exc:
        raise ModelError(cache_refusal("model: demo: cannot build the demo model", exc)) from None


def check_local_model(model: str) -> None:
    """resolve_model's refusal of a local path (missing, a folder, not GGUF) at once; a Hub name
    or `demo`, which may take a download or a build, is left to resolve_model."""
    if model != "demo" and not is_hub_name(model):
        resolve_model(model)


def identify(path: str) -> ModelIdentity:
    """The model's identity (see the module docstring), over every part of a split GGUF: a part
    other than the first changed changes it. ModelError if a header is unreadable or a part missing."""
    return identify_files(path, model_parts(path))


def identify_files(path: str, parts: list[str]) -> ModelIdentity:
    """The identity of the model at `path` made of the files `parts` (the same files opened
    otherwise: /proc/self/fd/N of each part held open)."""
    h = hashlib.sha256()
    size = mtime = 0
    for part in parts:
        try:
            _digest(h.update, part, read_layout(part))
            st = os.stat(part)
        except GGUFFormatError as exc:
            raise ModelError(f"{part}: the model file is truncated or corrupt ({exc})") from None
        except OSError as exc:
            raise ModelError(f"{part}: cannot read the model file ({exc.strerror or exc})") from None
        size, mtime = size + st.st_size, max(mtime, int(st.st_mtime))
    return ModelIdentity(os.path.abspath(path), size, mtime, h.hexdigest())


def sample_offsets(layout: GGUFLayout) -> list[int]:
    """Where the weights are sampled: each tensor's first block and a block in its middle (its
    end is where the next tensor starts), and SPREAD_BLOCKS blocks spread over the whole file."""
    starts = sorted(set(layout.tensor_offsets))
    ends = starts[1:] + [layout.file_size]
    offsets = set(starts) | {s + (e - s) // 2 for s, e in zip(starts, ends)}
    offsets |= {layout.file_size * i // SPREAD_BLOCKS for i in range(SPREAD_BLOCKS)}
    return sorted(o for o in offsets if o < layout.file_size)


def _digest(update: Callable[[bytes], None], path: str, layout: GGUFLayout) -> None:
    """One file's size, header and sampled weights into a sha256 (its `update`): for a single-file model the digest
    is what it was before split models were counted, so earlier journals and tuned layouts hold."""
    update(layout.file_size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        update(f.read(layout.header_end))
        for offset in sample_offsets(layout):
            update(os.pread(f.fileno(), BLOCK, offset))
