"""`ggbatch score` and `ggbatch run --score`: answers joined to gold answers by id, extracted
and compared (runner/scoring.py), printed as a table, optionally written as a JSON summary and
one scored line per question. Kept apart from cli.py and job.py so a run's code never depends
on scoring: `run --score` scores the files a finished run leaves (its input and its output)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional

from ..errors import ConfigError, GgbatchError, Interrupted
from ..files.formats.likely_fields import field_hint
from ..files.formats.written import check_text_output
from ..files.outputs import write_atomic
from ..files.paths import check_output, journal_of, same_file
from ..files.piped import STDIN, readable_file
from .files import first_fields, read_answers, read_gold
from .samples import score_samples
from .table import ScoreResult, details, format_table, naming_no_choice, parse_by, parse_extract, score, summary


def add_score_parser(sub: Any) -> None:
    """Register `ggbatch score` on the CLI's subcommands."""
    s = sub.add_parser("score", help="score an answers file against gold answers",
                       description="Answers are joined to gold answers by id; accuracy with its standard "
                                   "error, invalid and missing answers, per group with --by.")
    s.add_argument("--answers", required=True,
                   help="answers: ggbatch output (.json/.jsonl), OpenAI Batch output (.jsonl) or CSV")
    s.add_argument("--gold", required=True, help="gold answers: a question file (.json/.jsonl/.csv) with answers")
    s.add_argument("--extract", default="auto",
                   help="auto (by the gold answers), number (GSM8K), letter (multiple choice), exact, "
                        "or a regex whose first group is the answer (default auto)")
    s.add_argument("--by", help="regex over the id whose first group names a group, e.g. 'mmlu-(.*)-\\d+'")
    s.add_argument("--id-field", dest="id_field", default="questionID", help="id field or column (default questionID)")
    s.add_argument("--answer-field", dest="answer_field", default="answer",
                   help="answer field or column of the answers file (default answer)")
    s.add_argument("--gold-field", dest="gold_field", default="answer",
                   help="gold answer field of the gold file (default answer)")
    s.add_argument("--json", help="write the summary here (JSON)")
    s.add_argument("--details", help="write one scored JSON line per gold question here")


def score_files(answers_path: str, gold_path: str, extract: str = "auto", by: Optional[str] = None,
                id_field: str = "questionID", answer_field: str = "answer",
                gold_field: str = "answer") -> ScoreResult:
    """Read both files and score them (InputError or ConfigError for what cannot be)."""
    rule, pattern = parse_extract(extract)
    groups = parse_by(by)
    gold, without = read_gold(gold_path, id_field, gold_field)
    if not gold:
        others = [name for name in first_fields(gold_path) if name not in (gold_field, id_field, "question")]
        raise ConfigError(f"{gold_path}: no record has a gold '{gold_field}' (name it with --gold-field)"
                          f"{field_hint('--gold-field', gold_field, others)}")
    answers, unanswered = read_answers(answers_path, id_field, answer_field)
    scored, unknown, without_gold = score(gold, answers, rule, pattern, groups, without)
    return ScoreResult(scored, unknown, len(without), answers_path, gold_path, extract, by, without_gold,
                       score_samples(gold, answers, rule, pattern), answer_field, naming_no_choice(gold, rule),
                       sum(1 for g in gold if g.qid in unanswered))


def cmd_score(args: argparse.Namespace) -> int:
    """`ggbatch score`: exit 0 with the table, 2 (one line, raised) for what cannot be read."""
    parse_extract(args.extract)  # a bad regex fails before any file is read
    parse_by(args.by)
    for flag, out in (("--json", args.json), ("--details", args.details)):
        if out:
            check_output(out, f"the score's {flag} file")
            check_text_output(out, f"the score's {flag} file")
            _refuse_overwriting(out, args.answers, args.gold)
    if args.answers == STDIN and args.gold == STDIN:
        raise ConfigError("--answers and --gold both name standard input (-): one of them must be a file")
    if args.answers != STDIN and same_file(args.answers, args.gold):
        raise ConfigError(f"--answers and --gold are the same file ({args.gold}): scored against itself, every "
                          "answer is right; give the answers file a run wrote")
    _warn_if_swapped(args.answers, args.gold)
    with readable_file(args.answers) as answers, readable_file(args.gold) as gold:
        result = score_files(answers, gold, args.extract, args.by, args.id_field, args.answer_field,
                             args.gold_field)
    print(format_table(result))
    if args.json:
        write_atomic(args.json, json.dumps(summary(result), indent=1) + "\n", "the score's --json file")
    if args.details:
        write_atomic(args.details, details(result), "the score's --details file")
    return 0


def _warn_if_swapped(answers: str, gold: str) -> None:
    """A run keeps its journal beside its answers file, never beside a question file: a --gold
    with one and an --answers without looks like the two the wrong way round, which scores every
    answer wrong. Only a warning: two runs' answers scored against each other (agreement) are
    fine, and an answers file another tool wrote has no journal."""
    if STDIN in (answers, gold) or not os.path.exists(journal_of(gold)) or os.path.exists(journal_of(answers)):
        return
    print(f"ggbatch score: warning: --gold {gold} is a run's answers file (its journal is beside it) and "
          f"--answers {answers} is not: if they are the wrong way round, every answer scores wrong; swap "
          "--answers and --gold", file=sys.stderr)


def _refuse_overwriting(out: str, *inputs: str) -> None:
    for path in inputs:
        same = os.path.realpath(out) == os.path.realpath(path)
        if same or (os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path)):
            raise ConfigError(f"{out}: is also an input of this score ({path}); give another path")


def print_run_score(input_path: str, output_path: str, id_field: str, answer_norm: bool = False) -> None:
    """`run --score`: the same table for the run's input (gold answers in its `answer` field)
    and output; with `answer_norm` (choices scored by log-likelihood) a second one for its
    acc_norm picks, as `ggbatch score --answer-field answer_norm` prints it. A problem here is
    reported in one line and leaves the run's exit code alone: the answers are written and sound
    whatever their score."""
    try:
        gold, _ = read_gold(input_path, id_field)
        if not gold:
            print(f"ggbatch: score: {input_path} has no gold 'answer' fields: nothing to score", file=sys.stderr)
            return
        print(format_table(score_files(output_path, input_path, id_field=id_field)))
        if answer_norm:
            print(format_table(score_files(output_path, input_path, id_field=id_field, answer_field="answer_norm")))
    except Interrupted:
        raise  # the caller says it
    except GgbatchError as exc:
        print(f"ggbatch: score: {exc}", file=sys.stderr)
