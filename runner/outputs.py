"""Merging answers back into input order and writing the answers file atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from runner.errors import OutputError
from runner.inputs import JSONL_SUFFIXES
from workers.protocol import Answer


def merge(ids: Sequence[str], answers: Mapping[str, Answer],
          aliases: Optional[Mapping[str, str]] = None, id_field: str = "questionID") -> list[dict[str, Any]]:
    """One output row per input id, in input order. `aliases` maps a question id to the id
    whose answer it shares (identical prompts are answered once)."""
    rows = []
    for qid in ids:
        answer = answers.get((aliases or {}).get(qid, qid))
        row: dict[str, Any] = {id_field: qid}
        if answer is None:
            row.update(answer=None, error="not answered")
        elif answer.error is not None:
            row.update(answer=None, error=answer.error)
        else:
            row["answer"] = answer.text.strip()
        rows.append(row)
    return rows


def check_writable(path: str) -> None:
    """Fail before any work if the answers could not be written."""
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise OutputError(f"{path}: output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"{path}: output folder {folder} is not writable")
    if Path(path).is_dir():
        raise OutputError(f"{path}: output is a directory")


def render(rows: Iterable[Mapping[str, Any]], path: str) -> str:
    """`.jsonl`: one object per line; anything else: a JSON array (the seed format)."""
    if Path(path).suffix.lower() in JSONL_SUFFIXES:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return json.dumps(list(rows), ensure_ascii=False, indent=1) + "\n"


def write_atomic(path: str, text: str) -> None:
    """Write to a temporary file beside the target, then rename: readers never see half a file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.resolve().parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"{path}: could not write answers: {exc.strerror or exc}") from None
