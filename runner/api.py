"""ggbatch from Python: `run` a job (a job file, keyword arguments, or both) and `answer` a list of
questions held in memory. Both go through the same coordinator, workers and engine as
`ggbatch run`; they are exported as `ggbatch.run` and `ggbatch.answer`.

Workers are spawned processes, so a script calling these needs the `if __name__ == "__main__":`
guard (a notebook does not).
"""

from __future__ import annotations

import difflib
import json
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

from .config.schema import SCHEMA, SECTIONS, JobConfig, build_config, flatten, load_job_file
from .errors import ConfigError, InputError
from .job import run_job
from .report.report import RunReport

Question = Union[str, Mapping[str, Any]]


# answer()'s own files: the caller gives questions and gets answers back, not files
ANSWER_OWN = ("input", "output", "input_format", "output_format", "errors_output", "shard")


def job_config(job_file: Optional[str] = None, **settings: Any) -> JobConfig:
    """A checked job configuration: the job file's keys (if any), overridden by `settings`, which
    take the job file's keys as keyword arguments, nested (sampling={"temperature": 0.7}) or
    with dots spelled as double underscores (sampling__temperature=0.7)."""
    _check_keywords("ggbatch.run()", settings, also=("fresh", "progress"))
    return _job_config(job_file, settings, "ggbatch.run()")


def _job_config(job_file: Optional[str], settings: Mapping[str, Any], source: str) -> JobConfig:
    """job_config, its errors said of `source` (the function the caller called)."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if job_file is not None:
        layers.append((job_file, load_job_file(job_file)))
    nested: dict[str, Any] = {}
    for key, value in settings.items():
        *sections, name = key.split("__")
        target = nested
        for section in sections:
            target = target.setdefault(section, {})
        target[name] = value
    layers.append((source, flatten(nested, source)))
    return build_config(layers)


def keywords() -> list[str]:
    """The keyword arguments run() and answer() take as settings: the job file's top-level keys."""
    return sorted({key.split(".")[0] for key in SCHEMA} | SECTIONS)


def _check_keywords(source: str, settings: Mapping[str, Any], own: tuple[str, ...] = (),
                    also: tuple[str, ...] = ()) -> None:
    """A keyword argument that is no job key (or one of the function's `own`) is a GgbatchError
    naming it, with the valid ones (`also`: the function's other keyword arguments): Python's
    TypeError would point inside ggbatch."""
    valid = [k for k in keywords() if k not in own]
    for name in settings:
        top = name.split("__")[0]
        if top in own:
            raise ConfigError(f"{source}: {name}= is not taken here: {source[:-2]} makes its own files "
                              "and returns the answers (use ggbatch.run() to write files)")
        if top not in valid:
            hint = difflib.get_close_matches(top, valid, n=1)
            raise ConfigError(f"{source}: unknown key '{name}'"
                              + (f" (did you mean '{hint[0]}'?)" if hint else "")
                              + f"; the keyword arguments: {', '.join(sorted([*valid, *also]))}")


def run(job_file: Optional[str] = None, *, fresh: bool = False, progress: str = "auto",
        **settings: Any) -> RunReport:
    """Run a job, as `ggbatch run [JOB.yaml] [flags]` does, and return its report. Settings are
    the job file's keys (model, input, output, max_tokens, sampling={...}, ...). Raises
    ggbatch.GgbatchError (its exit_code is what the command line would return)."""
    return run_job(job_config(job_file, **settings), progress=progress, fresh=fresh, job_file=job_file)


@dataclass(frozen=True)
class Answered:
    """One question's answer, in the order the questions were given."""

    id: str
    text: Optional[str]  # None when the question could not be answered
    error: Optional[str] = None
    thinking: Optional[str] = None  # a reasoning model's <think> block, with keep_thinking=True
    choice_logprobs: Optional[dict[str, float]] = None  # with answer={"choices": ..., "logprobs": True}


def answer(questions: Union[str, Iterable[Question]], *, model: str, resume_dir: Optional[str] = None,
           **settings: Any) -> list[Answered]:
    """Answer questions held in memory: strings, or records (mappings with an id and a question
    field, and any fields prompt.template uses); one string is one question. Without
    `resume_dir` nothing is left on disk; with one, the questions, answers and journal are kept
    there, so calling again after a crash answers only what is missing."""
    _check_keywords("ggbatch.answer()", settings, ANSWER_OWN, also=("resume_dir",))
    # input and output are this function's own: placeholders until the folder is known
    config = _job_config(None, {"model": model, "input": "-", "output": "-", **settings}, "ggbatch.answer()")
    lines = _jsonl(_records(questions, config.id_field, config.question_field))
    with tempfile.TemporaryDirectory(prefix="ggbatch-answer-") as tmp:
        folder = Path(resume_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        questions_path, output = folder / "questions.jsonl", folder / "answers.jsonl"
        questions_path.write_text("".join(lines), encoding="utf-8")
        # this function's own files, in formats it reads back whatever the settings say
        try:
            run_job(replace(config, input=str(questions_path), output=str(output), input_format="jsonl",
                            output_format="jsonl", errors_output=None), progress="off")
        except (InputError, ConfigError) as exc:
            if str(questions_path) not in str(exc):
                raise
            said = in_callers_terms(str(exc), str(questions_path))
            raise (InputError(said) if isinstance(exc, InputError) else ConfigError(said)) from None
        return [Answered(str(r[config.id_field]), r.get("answer"), r.get("error"), r.get("thinking"),
                         r.get("choice_logprobs"))
                for r in map(json.loads, output.read_text(encoding="utf-8").splitlines())]


def _records(questions: Union[str, Iterable[Question]], id_field: str,
             question_field: str) -> list[dict[str, Any]]:
    """The caller's questions as records; one string is one question. A mapping, bytes or
    anything not iterable is refused: iterating them would ask their keys, bytes or nothing."""
    if isinstance(questions, str):
        questions = [questions]
    if isinstance(questions, (Mapping, bytes, bytearray)) or not isinstance(questions, Iterable):
        raise ConfigError(f"ggbatch.answer(): questions must be a string or a list of strings and records "
                          f"(mappings), got {type(questions).__name__}"
                          + (" (for one record, pass [record])" if isinstance(questions, Mapping) else ""))
    rows = []
    for i, q in enumerate(questions):
        if isinstance(q, str):
            rows.append({id_field: str(i), question_field: q})
        elif isinstance(q, Mapping):
            rows.append({id_field: str(i), **q})
        else:
            raise ConfigError(f"ggbatch.answer(): questions[{i}] must be a string or a mapping, "
                              f"got {type(q).__name__}")
    return rows


def _jsonl(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for i, row in enumerate(rows):
        try:
            # ASCII: a lone surrogate in a caller's string is written escaped, as JSON allows, not
            # refused by the UTF-8 encoder; the reader takes it from there as from any file
            lines.append(json.dumps(row) + "\n")
        except (TypeError, ValueError) as exc:  # a value JSON has no spelling for (a set, a date)
            raise ConfigError(f"ggbatch.answer(): questions[{i}]: {exc}") from None
    return lines


def in_callers_terms(message: str, questions_path: str) -> str:
    """An error about answer()'s own questions file, said of the caller's list: line N of the
    file is questions[N - 1] (one record a line), and the file is the list."""
    path = re.escape(questions_path)
    message = re.sub(path + r":(\d+)", lambda m: f"ggbatch.answer(): questions[{int(m.group(1)) - 1}]", message)
    message = re.sub(r"\(lines (\d+) and (\d+)\)",
                     lambda m: f"(questions[{int(m.group(1)) - 1}] and [{int(m.group(2)) - 1}])", message)
    return message.replace(questions_path, "ggbatch.answer(): questions")


__all__ = ["Answered", "answer", "job_config", "run"]
