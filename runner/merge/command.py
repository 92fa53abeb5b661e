"""`ggbatch merge --output OUT [--input QUESTIONS] PART...`: the files of a merge checked, the parts
read and merged (runner/merge/parts.py, runner/merge/join.py), OUT written atomically, and what keeps
it from being complete said one line each (runner/cli.py makes that exit 1).

Refused (exit 2, one line naming the files): an id in two parts, an id the question file does not
have, parts of different kinds (OpenAI Batch lines and answers rows), of different splits (by
their journals, else their names; a name saying another shard than its journal) or of different
jobs (by the settings in their journals: the first that differs), OUT being a part, the question
file, a journal or lock (a part's or any run's), standard output (/dev/stdout, /dev/fd/N), a pipe
or a device, as run refuses its output (runner/files/paths.py), a part whose run is still going
(its lock held: runner/merge/runs.py).
No part that exists at all is refused too (a glob that matched nothing).
Incomplete (OUT written, exit 1): a part file that does not exist, a part whose journal holds
answers it lacks (its run stopped before writing them) or, with the question file, answers made
for another version of a question than it holds, a shard no part is of,
questions no part holds (named: the first few and a count), rows without an answer.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..errors import ConfigError, InputError, quote
from ..files.formats import FORMATS
from ..files.formats.cells import check_id_column
from ..files.formats.detect import output_format
from ..files.formats.written import check_text_output
from ..files.inputs import read_question_file
from ..files.outputs import write_atomic
from ..files.paths import JOURNAL_SUFFIX, LOCK_SUFFIX, check_output, journal_of, lock_path, same_file
from ..files.piped import readable_file, shown_name
from ..files.shards import Shard, shard_in_name, shard_of
from ..journal.fingerprint import parts_rule_change, setting_change
from ..journal.journal import PENDING_SUFFIX
from ..words import counted
from .join import Merged, merge_rows, render_merged
from .parts import Part, part_ran, part_settings, part_shard, read_part
from .runs import answered_otherwise, refuse_running, unwritten

log = logging.getLogger("ggbatch")

SHOWN = 5  # missing ids named in the message


def add_merge_parser(sub: Any) -> None:
    """Register `ggbatch merge` on the CLI's subcommands."""
    m = sub.add_parser("merge", help="join the answers files of a sharded job (run --shard I/N) into one",
                       description="Rows are merged by id, in the question file's order with --input (else in the "
                                   "parts' order); an id in two parts is refused; questions no part holds are "
                                   "named (exit 1) and marked not answered.")
    m.add_argument("parts", nargs="+", metavar="PART", help="the shards' answers files (any output format)")
    m.add_argument("--output", required=True, help="the merged answers file")
    m.add_argument("--input", help="the question file: rows in its order, and every question accounted for")
    m.add_argument("--output-format", dest="output_format", choices=["auto", *FORMATS], default="auto",
                   help="auto: .csv CSV, .json JSON; else OpenAI Batch output when the parts are, JSON Lines "
                        "for .jsonl and .ndjson, JSON for any other name")
    m.add_argument("--input-format", dest="input_format", choices=["auto", *FORMATS], default="auto",
                   help="the question file's format, as ggbatch run takes it")
    m.add_argument("--id-field", dest="id_field", default="questionID",
                   help="id field of the question file and of the parts (OpenAI Batch lines: custom_id)")
    m.add_argument("--question-field", dest="question_field", default=None,
                   help="a question field every record of the question file must hold (default: none checked; "
                        "merge needs only the ids, and a job's prompt.template may read other fields)")
    m.add_argument("-q", "--quiet", action="store_true", help="nothing on stdout; problems only, on stderr")


def cmd_merge(args: argparse.Namespace) -> int:
    # Reading an OpenAI Batch question file notes the models its lines name: not news to a merge.
    logging.getLogger("ggbatch").setLevel(logging.WARNING)
    with readable_file(args.input) if args.input else nullcontext(None) as questions:
        outcome = merge_files(args.output, args.parts, questions, _auto(args.output_format),
                              _auto(args.input_format), args.id_field, args.question_field)
    if not args.quiet:
        order = f"in the order of {shown_name(args.input)}" if args.input else "in the parts' order"
        journals = _left_out(outcome)
        print(f"merged {counted(len(outcome.merged.rows), 'row')} from {counted(outcome.parts, 'part')} into "
              f"{outcome.output} ({outcome.format}, {order}{journals})")
    problems = outcome.problems()
    for line in problems:
        print(f"ggbatch: merge: {line}", file=sys.stderr)
    return 1 if problems else 0


def _left_out(outcome: "MergeOutcome") -> str:
    """What of the parts' run files given with them the summary line says was left out."""
    said = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in ((outcome.journals, "journal"),
                                                                (outcome.locks, "lock file")) if n]
    return f"; their {' and '.join(said)} left out" if said else ""


def _auto(value: str) -> Optional[str]:
    return None if value == "auto" else value


@dataclass(frozen=True)
class MergeOutcome:
    output: str
    format: str
    merged: Merged
    parts: int  # read
    absent: list[str] = field(default_factory=list)  # part files that do not exist
    split: int = 0  # N, when every part's journal or name says a shard of N
    absent_shards: list[int] = field(default_factory=list)  # of N, that no part is of
    journals: int = 0  # the parts' journals given beside them, left out
    locks: int = 0  # the parts' lock files given beside them (runs killed leave them), left out
    # parts whose journals hold answers they lack, or answers made for other versions of their questions
    unwritten: list[str] = field(default_factory=list)
    by_names: bool = True  # every part's name said its shard (else a journal said it)

    def problems(self) -> list[str]:
        """What keeps the merged file from being complete, one line each (none: all answered)."""
        said = [f"{path}: not found (an absent shard?)" for path in self.absent] + self.unwritten
        if self.absent_shards:
            absent = ', '.join(f'{i}/{self.split}' for i in self.absent_shards)
            said.append(f"no part is named for shard {absent}" if self.by_names
                        else f"no part is of shard {absent} (as the parts' journals and names say)")
        missing = self.merged.missing
        if missing:
            more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
            shards = sorted({shard_of(q, self.split) for q in missing}) if self.split else []
            whose = f" (by their ids, of shard {', '.join(f'{i}/{self.split}' for i in shards)})" if shards else ""
            said.append(f"{len(missing)} of {len(self.merged.rows)} questions {'is' if len(missing) == 1 else 'are'} "
                        "in no part: "
                        f"{', '.join(map(quote, missing[:SHOWN]))}{more}{whose}; {self.output} marks them "
                        "not answered")
        failed = self.merged.failed
        if failed:
            said.append(f"{failed} {'question has' if failed == 1 else 'questions have'} no answer in the parts "
                        "(the rows say why)")
        return said


def merge_files(output: str, paths: Sequence[str], questions: Optional[str] = None,
                output_fmt: Optional[str] = None, input_fmt: Optional[str] = None,
                id_field: str = "questionID", question_field: Optional[str] = None) -> MergeOutcome:
    """Merge the parts into `output` (written even when incomplete: MergeOutcome.problems says
    why). InputError or ConfigError for a merge that is refused; nothing is written then."""
    # An id field the rows write themselves is refused before any file is read, as a run refuses
    # it: read with it, the parts fail first on what it does to them (ids clashing, or unknown).
    # OUT's format is taken from its name or --output-format alone, the parts unread: so OpenAI
    # Batch parts (keyed by custom_id) merged into a .jsonl are refused it too, not a real use.
    check_id_column(id_field, [output_format(output, output_fmt, "json")])
    paths, journals, locks = _without_journals(paths)
    _check_paths(output, paths, questions)
    split, absent_shards, by_names = _split(paths)
    present = [p for p in paths if os.path.exists(p)]
    if not present:  # a merged file of nothing but "not answered" rows would pass for the job's answers
        raise ConfigError(f"no part exists ({', '.join(map(quote, paths[:SHOWN]))}: not found; a pattern the "
                          "shell found no file for is passed on as it is): nothing to merge, nothing written")
    refuse_running(present)
    settings = _check_one_job(present)
    _say_decided_apart(present)
    order, question_fmt, digests, integer_ids = None, None, {}, None
    if questions is not None:
        question_file = read_question_file(questions, id_field, question_field, input_fmt)
        order, question_fmt = [r.qid for r in question_file.records], question_file.format
        digests = {r.qid: r.digest for r in question_file.records}
        integer_ids = all(r.integer_id(id_field) for r in question_file.records)
    parts = [read_part(p, id_field) for p in present]
    merged = merge_rows(parts, order, questions or "")
    said = [line for p in parts if (line := unwritten(p))]
    said += [line for p in parts if questions is not None and (line := answered_otherwise(p, digests, questions))]
    fmt = _format(output, output_fmt, parts, question_fmt)
    write_atomic(output, render_merged(merged, fmt, id_field, _csv_header(parts), time.time(), settings, integer_ids))
    return MergeOutcome(output, fmt, merged, len(parts), [p for p in paths if not os.path.exists(p)], split,
                        absent_shards, journals, locks, said, by_names)


def _without_journals(paths: Sequence[str]) -> tuple[list[str], int, int]:
    """(the parts, how many journals and how many lock files of them were given too):
    `answers.shard-*` also matches each part's journal, which merge reads beside its part anyway,
    the lock a run killed left beside it, and a fresh run's journal not yet in place. One whose
    answers file is not given is refused: it holds no part's rows."""
    # by the file a path leads to, not its spelling: `./a.jsonl` and `a.jsonl.journal.jsonl` go together
    journals = {journal_of(q) for q in paths} | {journal_of(q) + PENDING_SUFFIX for q in paths}
    locks = {lock_path(os.path.realpath(q)) for q in paths}
    kept = [p for p in paths if os.path.realpath(p) not in journals | locks]
    for lone in kept:
        _not_a_run_file(lone)
    dropped = [p for p in paths if os.path.realpath(p) in locks]
    return kept, len(paths) - len(kept) - len(dropped), len(dropped)


def _not_a_run_file(path: str) -> None:
    """A journal or lock of an answers file that is not given, refused by what it is."""
    for suffix, what in ((JOURNAL_SUFFIX, "a run's journal"), (JOURNAL_SUFFIX + PENDING_SUFFIX, "a fresh run's "
                         "journal, not yet in place"), (LOCK_SUFFIX, "a run's lock file")):
        if path.endswith(suffix):
            raise ConfigError(f"{path}: {what}, not an answers file: give the answers file it is kept beside "
                              f"({path[:-len(suffix)]}), which the rerun of its job writes")


def _check_paths(output: str, paths: Sequence[str], questions: Optional[str]) -> None:
    for i, path in enumerate(paths):
        twice = next((p for p in paths[:i] if same_file(p, path)), None)
        if twice is not None:
            raise ConfigError(f"{path}: given twice as a part ({twice})")
    for role, other in [("the question file", questions)] + [("a part", p) for p in paths]:
        if other is not None and same_file(output, other):
            raise ConfigError(f"the merged output {output} is {role} ({other}); give another path")
    check_output(output, "the merged output")
    check_text_output(output, "the merged output")


def _check_one_job(paths: Sequence[str]) -> Optional[dict[str, Any]]:
    """The job's settings, as the parts' journals say them (None: no part has its journal).
    Refuse parts whose journals say they were answered with different settings (another
    model, another max_tokens, ...): merged, they would read as one job's answers. A part
    without a journal beside it cannot say, and is taken as it is."""
    first: Optional[tuple[str, dict[str, Any]]] = None
    for path in paths:
        settings = part_settings(path)
        if settings is None:
            continue
        if first is None:
            first = (path, settings)
            continue
        change = setting_change(first[1], settings)
        if change is not None:
            key, was, now = change
            # ggbatch's own rules and a grammar in words, as a run's resume refusal says them
            said = parts_rule_change(key, was, now, first[0], path) or (
                f"{first[0]} and {path} were answered with different '{key}' ({quote(was)} and {quote(now)}, "
                "as their journals say)")
            raise ConfigError(f"parts of two jobs: {said}; merge the shards of one job")
    return first[1] if first is not None else None


def _say_decided_apart(paths: Sequence[str]) -> None:
    """Warn of shards whose runs decided flash attention otherwise on auto (each from the
    questions it holds: one with a long question runs it, the others do not): their greedy
    answers at near-ties may differ from one run's. Not refused: shards may run on other machines."""
    ran = {path: part_ran(path).get("flash_attn") for path in paths}
    on = [path for path, flash in ran.items() if flash is True]
    off = [path for path, flash in ran.items() if flash is False]
    if on and off:
        log.warning("%s ran flash attention and %s did not (flash_attn: auto decides it for each shard's "
                    "questions): an answer at a near-tie may differ from one run's; set flash_attn to make the "
                    "shards agree", on[0], off[0])


def _split(paths: Sequence[str]) -> tuple[int, list[int], bool]:
    """(N, the shards of N no part is of, whether every part's name said its shard) when every
    part's journal or name says a shard of one N (a journal's `"shard": "2/8"`, a name's
    `answers.shard-2-of-8.jsonl`), else (0, [], True). A part whose name says another shard than
    its journal is refused: renamed as some other shard, it would hide that shard's absence."""
    said = [(p, _shard_of_part(p)) for p in paths]
    named = [(p, s) for p, s in said if s is not None]
    if not named or len(named) < len(paths):
        return 0, [], True
    first_path, first = named[0]
    for path, shard in named:
        if shard.count != first.count:
            raise InputError(f"parts of two splits: {first_path} is shard {first}, {path} is shard {shard}")
    given = {shard.index for _, shard in named}
    by_names = all(shard_in_name(p) is not None for p in paths)
    return first.count, [i for i in range(first.count) if i not in given], by_names


def _shard_of_part(path: str) -> Optional[Shard]:
    """The shard its journal says its run answered, else the one its name says (a part copied
    without its journal); InputError when the two differ."""
    named, ran = shard_in_name(path), part_shard(path)
    if named is not None and ran is not None and named != ran:
        raise InputError(f"{path}: its name says shard {named}, its journal that its run answered shard {ran}: "
                         "name each part after the shard it holds")
    return ran or named


def _format(output: str, requested: Optional[str], parts: Sequence[Part], question_fmt: Optional[str]) -> str:
    """OUT's format: --output-format, else by its name as a run decides (runner/files/formats/detect.py),
    OpenAI Batch output when the parts are (or, with no part, the question file is)."""
    # an empty part (a shard without questions) is of no kind: an empty file reads as JSON Lines
    lines = [p for p in parts if p.rows and p.lines]
    fields = [p for p in parts if p.rows and not p.lines]
    if lines and fields:
        raise InputError(f"{lines[0].path} holds OpenAI Batch output lines and {fields[0].path} answers rows: "
                         "merge parts of one kind")
    source = "openai" if lines else "json" if fields else question_fmt or "json"
    fmt = output_format(output, requested, source)
    if lines and fmt != "openai":
        raise ConfigError(f"{output}: the parts are OpenAI Batch output, which merge keeps line by line and "
                          f"does not convert to {fmt}: {_keep_lines(output, requested)}")
    if fields and fmt == "openai":
        raise ConfigError(f"{output}: OpenAI Batch output is made by a run (its lines hold token counts and "
                          f"ids); the parts are {fields[0].format} answers rows: merge them into json, jsonl or csv")
    return fmt


def _keep_lines(output: str, requested: Optional[str]) -> str:
    """How to merge OpenAI Batch parts into OUT, given how its format came to be other than theirs:
    from --output-format (dropped, a name of lines keeps them) or from OUT's name (.csv, .json)."""
    if requested is None:
        return "name it .jsonl or give --output-format openai"
    if output_format(output, None, "openai") == "openai":
        return (f"drop --output-format {requested} (its name keeps them as OpenAI Batch output) "
                "or give --output-format openai")
    return f"give --output-format openai, or drop --output-format {requested} and name it .jsonl"


def _csv_header(parts: Sequence[Part]) -> tuple[str, ...]:
    """The CSV parts' header (they must agree), or () to take the run's columns."""
    headers = [p for p in parts if p.columns]
    for part in headers[1:]:
        if part.columns != headers[0].columns:
            raise InputError(f"{part.path}:1: its header ({', '.join(part.columns)}) is not that of "
                             f"{headers[0].path} ({', '.join(headers[0].columns)})")
    return headers[0].columns if headers else ()
