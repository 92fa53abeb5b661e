"""Where ggbatch's text may be written: its answers, errors and reports are JSON, JSON Lines or
CSV, so a path named for another format (`answers.parquet`, `answers.xlsx`) would hold JSON
that nothing opening such a file reads, and an existing file that is no text (a model given as
the output by mistake, a workbook) would be lost to the answers. Both are refused before any
work starts, naming the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ...errors import ConfigError
from .magic import BINARY_MAGIC, SPREADSHEET_SUFFIXES, binary_kind

# suffixes of formats that are not text, with the pandas call that writes one from JSON Lines
_OTHER_FORMATS = {".parquet": "to_parquet", ".feather": "to_feather", ".arrow": "to_feather",
                  **{suffix: "to_excel" for suffix in SPREADSHEET_SUFFIXES},
                  ".gguf": "", ".gz": "", ".xz": "", ".zst": "", ".bz2": "", ".zip": "", ".db": "", ".sqlite": "",
                  ".pdf": "", ".png": "", ".jpg": "", ".pkl": "", ".pickle": "", ".npy": "", ".npz": "",
                  ".safetensors": ""}
# how many first bytes tell a file's kind (the longest magic, and a ZIP archive's first entry names)
_HEAD = max(512, *map(len, BINARY_MAGIC))


def check_text_output(path: str, role: str) -> None:
    """ConfigError for a text file written under another format's suffix, or over a file that is
    not text. `role`: what the file is to the command ("the answers file (output)")."""
    suffix = Path(path).suffix.lower()
    if suffix in _OTHER_FORMATS:
        pandas, lines = _OTHER_FORMATS[suffix], Path(path).with_suffix(".jsonl").name
        then = (f"; pandas makes the {suffix} file from the lines: pd.read_json({lines!r}, lines=True)."
                f"{pandas}({Path(path).name!r})") if pandas else ""
        raise ConfigError(f"{path}: {role} would be text under a {suffix} name: ggbatch writes JSON, JSON Lines or "
                          f"CSV; name it .jsonl, .json or .csv{then}")
    kind = _kind_of(path)
    if kind is not None:
        raise ConfigError(f"{path}: {role} would replace this file, {kind}; give another path")


def _kind_of(path: str) -> Optional[str]:
    """What an existing file is, where it is not text; None for text, or for no file."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            start = f.read(_HEAD)
    except OSError:  # unreadable: check_writable says whether it can be written
        return None
    known = binary_kind(path, start)
    return None if known is None else known[0]
