"""A score's result and its three renderings: the table people read, the JSON summary machines
read, and one JSON line per question to see why each was right or wrong. Pure functions."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import AbstractSet, Any, Mapping, Optional, Sequence

from ..errors import ConfigError
from ..words import counted
from .files import Answered
from .rules import RULES, Gold, Scored, Tally, by_group, gold_key, group_of, score_one, tally
from .samples import SampleScores

STDERR_FORMULA = "sqrt(p*(1-p)/(n-1)), the sample standard error of the mean (lm-evaluation-harness mean_stderr)"


@dataclass(frozen=True)
class ScoreResult:
    scored: list[Scored]  # one per gold question, in gold file order
    answers_not_in_gold: int  # answers whose id no gold record has: counted, not scored
    gold_without_answer: int  # gold records without a gold answer: not scored
    answers_path: str
    gold_path: str
    extract: str  # the --extract value as given
    by: Optional[str] = None  # the --by pattern as given
    answers_without_gold_answer: int = 0  # answers to those gold records: counted apart, not scored
    samples: Optional[SampleScores] = None  # maj@k and pass@k, when answers have several samples
    answer_field: str = "answer"  # the answers' field scored (answer_norm: lm-eval's acc_norm picks)
    # Gold answers scored by the letter rule that name none of their record's choices (neither a
    # label nor a choice's text): wrong whatever the answer, so the table says so (their ids).
    gold_naming_no_choice: tuple[str, ...] = ()
    # Of the missing, the gold questions whose row says the run never answered them (it ended
    # first, or no shard held them): a score of an unfinished run, which the table says.
    not_answered: int = 0


def parse_extract(value: str) -> tuple[str, Optional[re.Pattern[str]]]:
    """--extract: one of RULES, or a regular expression (rule 'regex')."""
    if value in RULES:
        return value, None
    return "regex", _compile(value, "--extract")


def parse_by(value: Optional[str]) -> Optional[re.Pattern[str]]:
    return _compile(value, "--by") if value else None


def _compile(pattern: str, flag: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{flag}: not a valid regular expression: {exc} in {pattern!r}") from None


def naming_no_choice(gold: Sequence[Gold], rule: str) -> tuple[str, ...]:
    """The ids of gold answers that the letter rule (or auto, which picks it for choices) can
    never match: their record has choices, and the gold answer is neither a label nor a text of one."""
    if rule not in ("auto", "letter"):
        return ()
    return tuple(g.qid for g in gold if g.choices and gold_key(g)[0] not in g.choices)


def score(gold: Sequence[Gold], answers: Mapping[str, Answered], rule: str,
          pattern: Optional[re.Pattern[str]] = None, by: Optional[re.Pattern[str]] = None,
          no_gold: AbstractSet[str] = frozenset()) -> tuple[list[Scored], int, int]:
    """(each gold question scored, answers whose id is not in the gold file, answers to the gold
    file's records without a gold answer: `no_gold`, their ids). A gold id without an answer is
    missing: scored as wrong, and counted. An answer of several samples is scored by its first."""
    scored = [score_one(g, first_sample(answers.get(g.qid)), rule, group_of(g.qid, by), pattern) for g in gold]
    known = {g.qid for g in gold}
    unscored = [qid for qid in answers if qid not in known]
    without_gold = sum(1 for qid in unscored if qid in no_gold)
    return scored, len(unscored) - without_gold, without_gold


def first_sample(answer: Answered) -> Optional[str]:
    """The answer's first sample: the accuracy is what n = 1 gets, and a sample cut short (null)
    fails its question at n = 1, so a null first sample is missing as a failed question is."""
    return answer[0] if isinstance(answer, list) else answer


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _row(name: str, t: Tally, width: int) -> str:
    return (f"{name:<{width}} {t.n:>6} {t.correct:>8} {_percent(t.accuracy):>9} {_percent(t.stderr):>8} "
            f"{t.invalid:>8} {t.missing:>8}")


def format_table(result: ScoreResult) -> str:
    """The table printed by `ggbatch score` and `ggbatch run --score`."""
    overall = tally(result.scored)
    groups = by_group(result.scored) if result.by else {}
    width = max([len("group"), len("all"), *map(len, groups)])
    rules = ", ".join(f"{rule} for {n}" for rule, n in sorted(Counter(s.rule for s in result.scored).items()))
    field = "" if result.answer_field == "answer" else f" ({result.answer_field})"
    lines = [f"score of {result.answers_path}{field} against {result.gold_path} (extraction: {rules or 'none'})",
             f"{'group':<{width}} {'n':>6} {'correct':>8} {'accuracy':>9} {'± s.e.':>8} {'invalid':>8} {'missing':>8}"]
    lines += [_row(name, t, width) for name, t in groups.items()]
    lines.append(_row("all", overall, width))
    lines.append(f"accuracy {_percent(overall.accuracy)} ± {_percent(overall.stderr)} over "
                 f"{counted(overall.n, 'question')} (standard error sqrt(p(1-p)/(n-1)))"
                 + (" of each question's first sample" if result.samples else ""))
    if result.samples:
        lines.append(_samples_line(result.samples))
    if result.not_answered:
        lines.append(f"not answered: {result.not_answered} of the missing (the run ended before them, or no shard "
                     "held them): the score of an unfinished run; run it again (it resumes), or merge every part")
    if result.answers_not_in_gold:
        lines.append(f"answers whose id is not in the gold file: {result.answers_not_in_gold} (not scored)")
    if result.gold_naming_no_choice:
        stray = result.gold_naming_no_choice
        lines.append(f"gold answers that name none of their record's choices: {len(stray)} (first: {stray[0]}; "
                     "scored wrong whatever the answer: check the gold field, or --extract)")
    if result.gold_without_answer:
        answered = result.answers_without_gold_answer
        lines.append(f"gold records without a gold answer: {result.gold_without_answer}"
                     f"{f', {answered} of them answered' if answered else ''} (not scored)")
    return "\n".join(lines)


def _samples_line(s: SampleScores) -> str:
    """maj@k and pass@k, and what their denominator holds: every gold question, as the accuracy's."""
    passes = ", ".join(f"pass@{k} {_percent(v)}" for k, v in s.pass_at.items())
    parts = [f"{s.sampled} with samples"]
    if s.single:
        parts.append(f"{s.single} with one answer (a vote of one)")
    if s.unanswered:
        parts.append(f"{s.unanswered} without an answer (wrong)")
    return (f"samples    maj@{s.k} {_percent(s.maj)} ({s.maj_correct} correct by majority vote), {passes} "
            f"over {counted(s.questions, 'question')}: {', '.join(parts)}")


def _tally_json(t: Tally) -> dict[str, Any]:
    return {"n": t.n, "correct": t.correct, "accuracy": t.accuracy, "stderr": t.stderr,
            "invalid": t.invalid, "missing": t.missing}


def summary(result: ScoreResult) -> dict[str, Any]:
    """The machine-readable summary (`--json`)."""
    out: dict[str, Any] = {
        "answers": result.answers_path, "answer_field": result.answer_field, "gold": result.gold_path,
        "extract": result.extract,
        "rules": dict(sorted(Counter(s.rule for s in result.scored).items())),
        "overall": _tally_json(tally(result.scored)), "stderr_formula": STDERR_FORMULA,
        "answers_not_in_gold": result.answers_not_in_gold, "gold_without_answer": result.gold_without_answer,
        "answers_without_gold_answer": result.answers_without_gold_answer,
        "gold_naming_no_choice": len(result.gold_naming_no_choice), "not_answered": result.not_answered,
    }
    if result.samples:
        s = result.samples
        out["samples"] = {"questions": s.questions, "with_samples": s.sampled, "with_one_answer": s.single,
                          "without_answer": s.unanswered, "k": s.k, f"maj@{s.k}": s.maj,
                          "maj_correct": s.maj_correct, **{f"pass@{k}": v for k, v in s.pass_at.items()}}
    if result.by:
        out["by"] = result.by
        out["groups"] = {name: _tally_json(t) for name, t in by_group(result.scored).items()}
    return out


def details(result: ScoreResult) -> str:
    """One JSON line per gold question (`--details`): why it counted as it did."""
    return "".join(json.dumps({"id": s.qid, "group": s.group, "gold": s.gold, "rule": s.rule,
                               "extracted": s.extracted, "correct": s.correct, "status": s.status,
                               "answer": s.raw}, ensure_ascii=False) + "\n" for s in result.scored)
