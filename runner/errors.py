"""Domain errors. Raised deep inside; only the CLI turns them into one line and an exit code."""

from __future__ import annotations

import errno
import json
import resource
from contextlib import contextmanager
from typing import Any, Iterator, Sequence


def quote(value: Any, limit: int = 60) -> str:
    """The value as a user writes it, cut to `limit` characters: a string in quotes, anything else
    in JSON's spelling, which a job file's YAML and a JSON input share (true, null, [1, 2], not
    Python's True, None, (1, 2)). An error line stays one short line whatever the value (a pasted
    document, a million-digit number)."""
    try:
        try:
            text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        except TypeError:  # no JSON spelling (a set, an object): Python's
            text = repr(value)
    except ValueError:  # int -> str refuses more than 4,300 digits
        text = f"<a {type(value).__name__} too large to show>"
    return text if len(text) <= limit else f"{text[:limit - 14]}... ({len(text):,} chars)"


def half_surrogate(text: str) -> str:
    """Where `text` holds half of a surrogate pair, in words ("U+D800 at character 3 is half of a
    surrogate pair"), or "" where it is text UTF-8 can write. JSON's and YAML's escape "\\ud800"
    writes such a half; no UTF-8 file, tokenizer or prompt can hold it. (The worker's tokenizer
    says it in the same words: workers/tokenizer/process.py, which cannot import this.)"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"U+{ord(text[exc.start]):04X} at character {exc.start + 1} is half of a surrogate pair"
    return ""


class GgbatchError(Exception):
    """Anything that ends a ggbatch command: the CLI prints it as one line and exits with
    `exit_code`. The default, 2, is a problem the user can fix before running again: bad usage,
    config, input, model, files or limits."""

    exit_code = 2


class ConfigError(GgbatchError):
    pass


class KeysError(ConfigError):
    """A refusal of settings that do not hold together, or of one checked after the config is
    built (workers against the cores): `keys`, the dotted keys it is about, let whoever knows
    where each was set name the job file, as a key's own error does."""

    def __init__(self, message: str, keys: Sequence[str]) -> None:
        super().__init__(message)
        self.keys = tuple(keys)


class StartOver(ConfigError):
    """A refusal that starting over lifts: an earlier run's journal this run cannot continue. The
    problem is the raiser's, the way to start over the caller's (run_job's and ggbatch.run's
    `fresh=True`, the command line's `--fresh`), so the caller that knows its own spelling says
    the error again in it (`said_as`); `remedy` holds "{how}" where that spelling goes."""

    def __init__(self, problem: str, remedy: str, how: str = "pass fresh=True") -> None:
        super().__init__(f"{problem}; {remedy.format(how=how)}")
        self.problem, self.remedy = problem, remedy

    def said_as(self, how: str) -> "StartOver":
        return StartOver(self.problem, self.remedy, how)


class InputError(GgbatchError):
    pass


class ModelError(GgbatchError):
    pass


class OutputError(GgbatchError):
    pass


class JournalError(OutputError):
    """An answer could not be appended to the journal (a full disk, a file size limit, the file
    cut short by another program): the run ends as a stop does, the answers file written with
    every answer the journal holds."""


class WorkerFailure(GgbatchError):
    """The run gave up on its workers (a crash loop, none can start any more); the answers so far
    are written. Exit code 1, like a run where some questions failed."""

    exit_code = 1


class Interrupted(GgbatchError):
    """Stopped by SIGINT, SIGTERM or SIGHUP; everything answered so far is written and journaled."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP


@contextmanager
def open_files_limit_named() -> Iterator[None]:
    """An OSError for the process's open-files limit (`ulimit -n`), reached while a child's pipes
    are made, as one line naming the limit: Python's own is a traceback from deep in multiprocess."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        raise GgbatchError(f"too many open files: this process may hold {soft} (ulimit -n), and each worker and "
                           "the tokenizer process take about 6 for their pipes: raise the limit (ulimit -n 4096) "
                           "or run fewer workers") from None
