"""The files a job reads and writes, checked before any work starts: no two of them may be the
same file, and every output must be writable.

A job reads its question file, its model and its job file; it writes the answers file, the
answers' journal and lock beside it, and the report. Two of these resolving to one file means
one is about to destroy the other (`--output` equal to `--input` would overwrite the questions,
`--report` equal to `--output` would replace the answers with the report), so that is refused,
naming both. "The same file" means the same after following symlinks, or the same inode (a hard
link).

An output given as a symlink is followed: the answers are written to the file it points to
(atomically, through a temporary file beside that file), the link stays a link, and the journal
and lock sit beside the real file, so two links to one file share one lock.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, OutputError
from .formats.written import check_text_output

JOURNAL_SUFFIX = ".journal.jsonl"
LOCK_SUFFIX = ".lock"
# what a job's files are called in its refusals (check_writable's role, same_file_error's)
OUTPUT, REPORT, ERRORS_OUTPUT = "the answers file (output)", "the report", "the errors file (errors_output)"
WRITTEN = {OUTPUT, REPORT, ERRORS_OUTPUT, "the output's journal", "the output's lock"}
PROBE_BYTES = 4096  # written and removed once: a full disk fails here, not after the run


def ggbatch_cache() -> Path:
    """ggbatch's cache folder (the demo model, `ggbatch tune`'s layouts): $XDG_CACHE_HOME/ggbatch,
    ~/.cache/ggbatch when XDG_CACHE_HOME is unset or empty (as the XDG spec says)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ggbatch"


def writable_cache(what: str) -> Path:
    """ggbatch's cache folder, made if missing; OutputError, one line naming the folder, when it
    cannot be made or written (a HOME a cron user cannot write, XDG_CACHE_HOME naming a file).
    `what` is what needed it ("model: demo: cannot build the demo model")."""
    folder = ggbatch_cache()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise OutputError(cache_refusal(what, exc)) from None
    return folder


def cache_refusal(what: str, exc: OSError) -> str:
    return (f"{what} in ggbatch's cache folder {ggbatch_cache()} ({exc.strerror or exc}: {exc.filename}): "
            "set XDG_CACHE_HOME to a folder this user can write")


# a link (https://, s3://, hf://): ggbatch reads local files, and downloads models only through
# huggingface_hub's cache (runner/model/hub.py)
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def url_hint(name: str, what: str) -> str:
    """What to say of a link given as a file ggbatch reads (`what`: "the model"), '' for a path."""
    if not URL.match(name):
        return ""
    if name.startswith("hf://datasets/"):
        return (f" (a Hugging Face dataset: ggbatch reads {what} from a local file; write the split as JSON "
                "Lines first: datasets.load_dataset(NAME, split=SPLIT).to_json('questions.jsonl'))")
    return f" (a link: ggbatch reads {what} from a local file; download it first (curl -LO URL) and give its path)"


def closest_file(path: str) -> str:
    """What to add to "PATH: ... not found": the name in its folder closest to the one given ("; did
    you mean models/qwen2.5-0.5b-instruct-q4_k_m.gguf?": a quantization, a version or an extension
    mistyped), or nothing (none is close, or the folder cannot be listed)."""
    folder, name = os.path.split(path)
    try:
        names = os.listdir(os.path.expanduser(folder) or ".")
    except OSError:
        return ""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return f"; did you mean {os.path.join(folder, close[0])}?" if close else ""


def files_inside(folder: str, suffixes: tuple[str, ...]) -> str:
    """What to add to "FOLDER: ... is a directory": the files in it with these suffixes, which
    the user likely meant one of (" (it holds a.gguf and b.gguf: give one of them)"), or nothing."""
    try:
        names = sorted(name for name in os.listdir(folder) if name.lower().endswith(suffixes))
    except OSError:
        return ""
    if len(names) == 1:
        return f" (give the file it holds: {os.path.join(folder, names[0])})"
    if not names:
        return ""
    shown = " and ".join(names) if len(names) <= 2 else f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
    return f" (it holds {shown}: give one of them)"


def journal_path(output: str) -> str:
    return output + JOURNAL_SUFFIX


def journal_of(output: str) -> str:
    """The journal a run writing `output` keeps: beside the file the path leads to (symlinks
    followed, as job_paths resolves the output)."""
    return journal_path(os.path.realpath(output))


def lock_path(output: str) -> str:
    return output + LOCK_SUFFIX


@dataclass(frozen=True)
class JobPaths:
    input: str
    model: str
    output: str  # symlinks followed
    report: Optional[str] = None  # symlinks followed
    job_file: Optional[str] = None
    errors_output: Optional[str] = None  # symlinks followed

    @property
    def journal(self) -> str:
        return journal_path(self.output)

    @property
    def lock(self) -> str:
        return lock_path(self.output)

    def roles(self) -> list[tuple[str, str]]:
        """(what it is to the job, path) for every file the job touches."""
        named = [("the question file (input)", self.input), ("the model", self.model),
                 ("the job file", self.job_file), *self.outputs(),
                 ("the output's journal", self.journal),
                 ("the output's lock", self.lock)]
        return [(role, path) for role, path in named if path]

    def outputs(self) -> list[tuple[str, str]]:
        """(what it is to the job, path) for each file the job writes at its end."""
        named = [(OUTPUT, self.output), (REPORT, self.report), (ERRORS_OUTPUT, self.errors_output)]
        return [(role, path) for role, path in named if path]


def job_paths(input_path: str, model: str, output: str, report: Optional[str] = None,
              job_file: Optional[str] = None, errors_output: Optional[str] = None) -> JobPaths:
    """The job's files, outputs resolved through symlinks, checked: distinct, text, writable."""
    for role, path in ((OUTPUT, output), (REPORT, report), (ERRORS_OUTPUT, errors_output)):
        if path:
            check_not_a_stream(path)
            check_file_name(path, role)  # before realpath, which drops a trailing slash
    paths = JobPaths(input_path, model, os.path.realpath(output),
                     os.path.realpath(report) if report else None, job_file,
                     os.path.realpath(errors_output) if errors_output else None)
    check_distinct(paths)
    for role, path in paths.outputs():
        check_text_output(path, role)
        check_writable(path, role)
    return paths


def check_output(path: str, role: str = "the output") -> None:
    """What every command checks of a file it writes (run's outputs, merge's --output, score's
    --json and --details, make-model's model): not a stream, not a journal or lock, and writable."""
    check_not_a_stream(path, role)
    check_not_a_journal(role, os.path.realpath(path))
    check_writable(path, role)


def check_not_a_stream(path: str, role: Optional[str] = None) -> None:
    """OutputError for standard output (`-`, /dev/stdout, /dev/fd/1, /proc/self/fd/1), a pipe or
    a device: a job's files are written whole at the end (renamed into place), the answers with a
    journal beside them that a rerun goes on from. /dev/stdout is refused whatever fd 1 is: were
    it a log file (`>> cron.log`), following the link would rename the answers over the log.
    `role`: what another command's file is (check_writable's words: "the model"); None, a run's."""
    if path == "-" or _through_a_descriptor(path) or (os.path.exists(path) and not os.path.isfile(path)
                                                      and not os.path.isdir(path)):
        what = (f"{role} whole, renamed into place" if role else "its files whole at the end, renamed into place "
                "(a run's answers with a journal beside them that a rerun goes on from)")
        raise OutputError(f"{path}: ggbatch writes {what}, not to standard output, a pipe or a device: "
                          "give a file's path")


def _through_a_descriptor(path: str) -> bool:
    """Whether the path, or a link on the way to its file, is an open descriptor's name:
    /dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N or /proc/PID/fd/N (each a link to whatever
    the descriptor is open on)."""
    step = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        step = os.path.join(os.path.realpath(os.path.dirname(step)), os.path.basename(step))
        if _DESCRIPTOR_NAME.match(step):
            return True
        if not os.path.islink(step):
            return False
        step = os.path.join(os.path.dirname(step), os.readlink(step))
    return False


_DESCRIPTOR_NAME = re.compile(r"^/dev/(std(in|out|err)|fd/[^/]+)$|^/proc/.+/fd/[^/]+$")


def check_distinct(paths: JobPaths) -> None:
    """ConfigError naming both roles when two of the job's files are one file, or when an output
    is the journal or lock of some other output."""
    roles = paths.roles()
    for i, (role_a, a) in enumerate(roles):
        for role_b, b in roles[i + 1:]:
            if same_file(a, b):
                # roles() lists what is read before what is written: role_b is the one written
                raise same_file_error(role_a, role_b, b, overwrites=role_b in WRITTEN)
    for role, path in paths.outputs():
        check_not_a_journal(role, path)


def same_file_error(read_role: str, written_role: str, path: str, overwrites: bool = True) -> ConfigError:
    """The refusal of a file written over one read (or two files of one job that are one file):
    both roles named, and what would be lost."""
    harm = f": ggbatch would overwrite {read_role.split(' (')[0]}" if overwrites else ""
    return ConfigError(f"{written_role} and {read_role} are the same file ({path}){harm}; give another path")


def check_not_a_journal(role: str, path: str) -> None:
    """ConfigError for an output named as a journal or a lock, or holding a journal: writing it
    would destroy the answers a rerun goes on from."""
    if path.endswith(JOURNAL_SUFFIX) or path.endswith(LOCK_SUFFIX) or _is_journal(path):
        raise ConfigError(f"{role} {path} is the journal or lock of another output; give another path")


def check_writable(path: str, role: str) -> None:
    """Fail before any work if a file could not be written there: the folder must exist and take
    a small write (a full disk or a read-only mount fails here, not after the run). `role` says
    which of a command's files it is ("the report"): a path alone may not tell."""
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise OutputError(f"{path}: the folder of {role}, {_not_a_folder(folder)}")
    if Path(path).is_dir():
        raise OutputError(f"{path}: {role} is a directory, not a file")
    check_file_name(path, role)
    _probe_write(path, folder, role)


def check_file_name(path: str, role: str) -> None:
    """OutputError for a path ending in a separator (`-o plots/`): it names a folder, and a file
    written there would drop the separator and take the folder's name."""
    if path.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        raise OutputError(f"{path}: {role} is a folder's name (it ends in {path[-1]}); give a file's path")


def check_folder_to_make(path: str, folder_of: str, role: str) -> None:
    """Fail before any work if `folder_of`, the folder a command makes with its parents later for
    `path` (as lm-eval makes its --output_path's), could not hold a file: the nearest of it and
    its parents that exists must be a folder and take a small write."""
    folder = Path(folder_of).resolve()
    nearest = next(p for p in (folder, *folder.parents) if p.exists())
    if not nearest.is_dir():
        raise OutputError(f"{path}: the folder of {role}, {_not_a_folder(folder)}")
    _probe_write(path, nearest, role)


def _probe_write(path: str, folder: Path, role: str) -> None:
    try:
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise OutputError(f"{path}: the folder of {role}, {folder}, is not writable: {exc.strerror or exc}") from None


def _not_a_folder(folder: Path) -> str:
    """Why `folder` is not one: a file stands where it or a folder above it would be (`--output
    q.jsonl/a.jsonl`), or it does not exist."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker == folder:
        return f"{folder}, is a file, not a folder"
    if blocker is not None and not blocker.is_dir():
        return f"{folder}, does not exist: {blocker} is a file, not a folder"
    return f"{folder}, does not exist"


def same_file(a: str, b: str) -> bool:
    """The same file after following symlinks, or the same inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False  # one of them does not exist yet


def _is_journal(path: str) -> bool:
    """An existing file whose first line is a ggbatch journal header (runner/journal/journal.py)."""
    try:
        with open(path, "rb") as f:
            return f.read(20).startswith(b'{"ggbatch_journal"')
    except OSError:
        return False
