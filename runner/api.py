"""ggbatch from Python: `run` a job (a job file, keyword arguments, or both), `answer` a list of
questions held in memory, and a warm `Pool` answering many calls with the model loaded once.
All go through the same workers, dispatch and engine as `ggbatch run`; they are exported as
`ggbatch.run`, `ggbatch.answer` and `ggbatch.Pool`.

Workers are spawned processes, so a script calling these needs the `if __name__ == "__main__":`
guard (a notebook does not).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar, Union

from .config.keywords import check_keywords, job_config, settings_layer
from .config.schema import JobConfig, build_config, key_said_by_call
from .errors import ConfigError, InputError, Interrupted, StartOver
from .job import run_job
from .pool.signals import STOP
from .questions.prompts import question_field_read
from .report.report import RunReport
from .warm.calls import Answered, answered
from .warm.pool import Pool
from .warm.records import Question, caller_records, caller_rows

# answer()'s own files: the caller gives questions and gets answers back, not files
ANSWER_OWN = ("input", "output", "input_format", "output_format", "errors_output", "shard")

T = TypeVar("T")


def _stopped_as_signals_do(call: Callable[[], T]) -> T:
    """`call`, a job run from Python; a SIGINT or SIGTERM that stopped it (its answers written)
    then ends the script as that signal does without ggbatch, as a plain answer() or a pool call
    does and as the command line's exit code says: KeyboardInterrupt for Ctrl-C (exit 130 when
    nothing catches it), SIGTERM's end (143). Interrupted only where the caller's own handler
    returned: cron, systemd and Slurm read exit 1 as a failure, not a stop."""
    try:
        return call()
    except Interrupted as exc:
        signum = exc.signum
    # Past the except, the stop's traceback (and the run's frames it holds) is let go, and a
    # KeyboardInterrupt raised here has no Interrupted as its context.
    STOP.pass_on(signum)
    raise Interrupted(signum)  # the caller's own handler returned: the run is stopped all the same


def run(job_file: Optional[str] = None, *, fresh: bool = False, progress: str = "auto",
        **settings: Any) -> RunReport:
    """Run a job, as `ggbatch run [JOB.yaml] [flags]` does, and return its report. Settings are
    the job file's keys (model, input, output, max_tokens, sampling={...}, ...). Raises
    ggbatch.GgbatchError (its exit_code is what the command line would return); a SIGINT or
    SIGTERM stops the run, writes its answers, and goes on as that signal does (KeyboardInterrupt)."""
    config = job_config(job_file, **settings)
    # a keyword's schema, grammar or template refused as it is used is said of this call, as its
    # other keywords' errors are
    with key_said_by_call("ggbatch.run()", settings_layer(settings, "ggbatch.run()")):
        return _stopped_as_signals_do(lambda: run_job(config, progress=progress, fresh=fresh, job_file=job_file))


def answer(questions: Union[str, Iterable[Question]], *, model: str,
           resume_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
           **settings: Any) -> list[Answered]:
    """Answer questions held in memory: strings, or records (mappings with an id and a question
    field, and any fields prompt.template uses); one string is one question. A pool opened for
    this one call (runner/warm/pool.py), planned for these questions as a job is for its file.
    With `resume_dir` the questions, answers and journal are kept there, as a job's files, so
    calling again after a crash answers only what is missing."""
    check_keywords("ggbatch.answer()", settings, ANSWER_OWN, also=("resume_dir",))
    if resume_dir is None and "report" in settings:  # only a resumable call runs as a job, which writes it
        raise ConfigError("ggbatch.answer(): report= is written only with resume_dir= (a job's files, kept "
                          "there); without it answer() writes no file: give resume_dir=, or drop report=")
    # input and output are this function's own: placeholders, as a pool has no files
    layer = settings_layer({"model": model, "input": "-", "output": "-", **settings}, "ggbatch.answer()")
    config = build_config([("ggbatch.answer()", layer)])
    rows = caller_rows(questions, config.id_field, config.question_field, "ggbatch.answer()")
    if resume_dir is not None and not isinstance(resume_dir, (str, os.PathLike)):
        raise ConfigError(f"ggbatch.answer(): resume_dir: must be a folder's path (a string or a Path), "
                          f"got {type(resume_dir).__name__}")
    if resume_dir is not None:  # run as a job: its keywords' errors said of this call, as a pool's are
        with key_said_by_call("ggbatch.answer()", layer):
            return _answer_resumable(config, rows, Path(resume_dir))
    records = caller_records(rows, config.id_field, question_field_read(config.prompt_template, config.question_field),
                             "ggbatch.answer()")
    with Pool.for_call(config, layer, "ggbatch.answer()", records) as pool:
        return pool.answer(rows)


def _answer_resumable(config: JobConfig, rows: list[dict[str, Any]], folder: Path) -> list[Answered]:
    """answer() as a job whose files are kept in `folder` (its journal makes a second call
    answer only what the first did not)."""
    lines = [json.dumps(row) + "\n" for row in rows]
    folder.mkdir(parents=True, exist_ok=True)
    questions_path, output = folder / "questions.jsonl", folder / "answers.jsonl"
    questions_path.write_text("".join(lines), encoding="utf-8")
    # this function's own files, in formats it reads back whatever the settings say
    try:
        job = replace(config, input=str(questions_path), output=str(output), input_format="jsonl",
                      output_format="jsonl", errors_output=None)
        _stopped_as_signals_do(lambda: run_job(job, progress="off"))
    except StartOver as exc:  # answer() has no fresh=: its journal is resume_dir's
        raise exc.said_as("use another resume_dir (or empty this one)") from None
    except (InputError, ConfigError) as exc:
        if str(questions_path) not in str(exc):
            raise
        said = in_callers_terms(str(exc), str(questions_path))
        raise (InputError(said) if isinstance(exc, InputError) else ConfigError(said)) from None
    written = map(json.loads, output.read_text(encoding="utf-8").splitlines())
    return [answered(str(r[config.id_field]), r) for r in written]


def in_callers_terms(message: str, questions_path: str) -> str:
    """An error about answer()'s own questions file, said of the caller's list: line N of the
    file is questions[N - 1] (one record a line), and the file is the list."""
    path = re.escape(questions_path)
    message = re.sub(path + r":(\d+)", lambda m: f"ggbatch.answer(): questions[{int(m.group(1)) - 1}]", message)
    message = re.sub(r"\(lines (\d+) and (\d+)\)",
                     lambda m: f"(questions[{int(m.group(1)) - 1}] and [{int(m.group(2)) - 1}])", message)
    return message.replace(questions_path, "ggbatch.answer(): questions")


__all__ = ["Answered", "Pool", "answer", "job_config", "run"]
