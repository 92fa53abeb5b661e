"""Merging answers back into input order and writing the answers file atomically, in its format
(runner/formats: a JSON array, JSON Lines, CSV, or OpenAI Batch output)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .errors import OutputError
from .formats.csvfile import render_csv
from .formats.jsonfile import render_json
from .formats.openai_output import render_openai
from .formats.rows import OutputSpec, Row, row_fields
from ..workers.protocol import Answer


def answer_rows(ids: Sequence[str], answers: Mapping[str, Answer], aliases: Optional[Mapping[str, str]] = None,
                unanswered: str = "not answered") -> list[Row]:
    """One row per input id, in input order. `aliases` maps a question id to the id whose answer
    it shares (identical prompts are answered once); a question without an answer gets
    `unanswered` as its error."""
    rows = []
    for qid in ids:
        answer = answers.get((aliases or {}).get(qid, qid))
        error = unanswered if answer is None else answer.error
        rows.append(Row(qid, answer, error))
    return rows


def merge(ids: Sequence[str], answers: Mapping[str, Answer],
          aliases: Optional[Mapping[str, str]] = None, id_field: str = "questionID",
          keep_thinking: bool = False, unanswered: str = "not answered") -> list[dict[str, Any]]:
    """answer_rows as the fields of a JSON or CSV answers file ({id, "answer", "error"?}); a
    reasoning model's `<think>` block is taken out of the answer (kept as "thinking" if asked)."""
    return [row_fields(row, id_field, keep_thinking) for row in answer_rows(ids, answers, aliases, unanswered)]


def render(rows: Sequence[Row], spec: OutputSpec) -> str:
    """The answers file's text in spec.format."""
    if spec.format == "openai":
        return render_openai(rows, spec)
    fields = [row_fields(row, spec.id_field, spec.keep_thinking) for row in rows]
    if spec.format == "csv":
        columns = [spec.id_field, "answer", "error"] + (["thinking"] if spec.keep_thinking else [])
        if any("choice_logprobs" in f for f in fields):  # as JSON text in one column
            columns.append("choice_logprobs")
            fields = [{**f, "choice_logprobs": json.dumps(f["choice_logprobs"])} if "choice_logprobs" in f else f
                      for f in fields]
        return render_csv(fields, columns)
    return render_json(fields, lines=spec.format == "jsonl")


def write_answers(path: str, rows: Sequence[Row], spec: OutputSpec, errors_path: Optional[str] = None) -> None:
    """The answers file, atomically. With `errors_path` the rows without an answer go there
    instead, in the same format (as OpenAI splits a batch into an output and an error file); each
    file in input order, the errors file written even when empty (never a stale one)."""
    if errors_path is not None:
        write_atomic(errors_path, render([r for r in rows if r.error is not None], spec))
        rows = [r for r in rows if r.error is None]
    write_atomic(path, render(rows, spec))


def write_atomic(path: str, text: str) -> None:
    """Write to a temporary file beside the target, then rename: readers never see half a file.
    A symlink is followed: the file it points to is replaced and the link stays a link."""
    target = Path(os.path.realpath(path))
    mode = _mode_for(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.resolve().parent)
    try:
        os.fchmod(fd, mode)  # mkstemp's 0600 would hide the answers from the pipeline's other users
        # newline="": the text is written as made (CSV's quoted line breaks stay as they are)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
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


def _mode_for(target: Path) -> int:
    """The permissions a plain open(target, "w") would leave: the file's own if it exists,
    otherwise 0666 less the umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        umask = os.umask(0)  # the only way to read it; set straight back
        os.umask(umask)
        return 0o666 & ~umask
