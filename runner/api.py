"""ggbatch from Python: `run` a job (a job file, keyword arguments, or both) and `answer` a list of
questions held in memory. Both go through the same coordinator, workers and engine as
`ggbatch run`; they are exported as `ggbatch.run` and `ggbatch.answer`.

Workers are spawned processes, so a script calling these needs the `if __name__ == "__main__":`
guard (a notebook does not).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

from .config import JobConfig, build_config, flatten, load_job_file
from .errors import ConfigError
from .job import run_job
from .report import RunReport

Question = Union[str, Mapping[str, Any]]


def job_config(job_file: Optional[str] = None, **settings: Any) -> JobConfig:
    """A checked job configuration: the job file's keys (if any), overridden by `settings`, which
    take the job file's keys as keyword arguments, nested (sampling={"temperature": 0.7}) or
    with dots spelled as double underscores (sampling__temperature=0.7)."""
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
    layers.append(("ggbatch.run()", flatten(nested, "ggbatch.run()")))
    return build_config(layers)


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


def answer(questions: Iterable[Question], *, model: str, resume_dir: Optional[str] = None,
           **settings: Any) -> list[Answered]:
    """Answer questions held in memory: strings, or records (mappings with an id and a question
    field, and any fields prompt.template uses). Without `resume_dir` nothing is left on disk;
    with one, the questions, answers and journal are kept there, so calling again after a crash
    answers only what is missing."""
    # input and output are this function's own: placeholders until the folder is known
    config = job_config(model=model, input="-", output="-", **settings)
    rows = _records(questions, config.id_field, config.question_field)
    with tempfile.TemporaryDirectory(prefix="ggbatch-answer-") as tmp:
        folder = Path(resume_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        questions_path, output = folder / "questions.jsonl", folder / "answers.jsonl"
        questions_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        # this function's own files, in formats it reads back whatever the settings say
        run_job(replace(config, input=str(questions_path), output=str(output), input_format="jsonl",
                        output_format="jsonl", errors_output=None), progress="off")
        return [Answered(str(r[config.id_field]), r.get("answer"), r.get("error"), r.get("thinking"),
                         r.get("choice_logprobs"))
                for r in map(json.loads, output.read_text(encoding="utf-8").splitlines())]


def _records(questions: Iterable[Question], id_field: str, question_field: str) -> list[dict[str, Any]]:
    rows = []
    for i, q in enumerate(questions):
        if isinstance(q, str):
            rows.append({id_field: str(i), question_field: q})
        elif isinstance(q, Mapping):
            rows.append({id_field: str(i), **q})
        else:
            raise ConfigError(f"answer(): question {i} must be a string or a mapping, got {type(q).__name__}")
    return rows


__all__ = ["Answered", "answer", "job_config", "run"]
