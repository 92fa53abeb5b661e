"""Scoring answers against gold answers: pure functions, no files (see files.py for those).

Extraction follows lm-evaluation-harness where it has a rule, so a score here means what the same
score there means:

- number (GSM8K): the harness's strict filter first, `#### (-?[0-9.,]+)`; else, like its
  flexible-extract filter, the last number in the text. Numbers are compared as decimals after
  dropping `$` and thousands commas, so "$18.00", "18.0" and "18" are equal (the harness compares
  strings, where "18.00" would miss; a number written two ways is the same answer); a minus sign
  written "−" (U+2212) is a minus.
- letter (MMLU, LSAT): on the first non-empty line, the line itself when punctuation aside it is
  one letter (`B`, `(B)`, `B.`, `**b**`) or a letter marker opening it (`B. 8`, `b) because`);
  else "answer is B" / "Answer: (B)" anywhere (the harness's chain-of-thought filters; a small
  letter only in brackets, "answer is (b)"); else "Option B" / "choice (C)" anywhere; else the
  first line equal to a choice's text (the harness's fallback to the choice text; of equal
  texts the first). Only the
  record's choice letters count (A-J without choices). Texts for choices (HellaSwag, PIQA as
  lm-eval keeps them: a list of texts, the gold answer one of them, the answers the texts
  `choice_scoring: loglikelihood` writes): a gold answer that is a choice's text names that
  choice, and so does an answer, before any letter is read from it (an answer "a" is the choice
  "a", not the letter A). A gold answer that is one letter names a letter (as MMLU's do), and its
  answers are read for a letter first.
- exact: both sides stripped, case-folded, whitespace collapsed, trailing punctuation removed.
- a regex: its first match's first group (whole match without groups), the harness's `regex`
  filter with group_select 0; compared as numbers when both sides are numbers, else as exact.

The standard error is the harness's `mean_stderr` of the 0/1 scores: the sample standard
deviation over sqrt(n), which for a proportion p is sqrt(p(1-p)/(n-1)).
"""

from __future__ import annotations

import functools
import math
import re
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Iterable, Mapping, Optional, Sequence

from ..files.formats.choices import LETTERS

RULES = ("auto", "number", "letter", "exact")  # and "regex", with the user's pattern
# The choices of a list past the tenth have no letter: they are named by their position from 1
# ("11"), and an answer names them by their text alone. A record's own labels of one character
# that are not letters (ARC's 1-4) count as its letters do.

STRICT_NUMBER = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-evaluation-harness gsm8k, strict-match
# A number as people write one: thousands commas only in threes ("1,000", not "1,2,3"), a dollar
# sign, a sign and decimals, the leading zero left out (".5", "$.50" is half a dollar, not 50); a
# sentence's full stop after it is not a decimal point.
NUMBER = re.compile(r"-?\$?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)")
PLAIN_NUMBER = re.compile(r"-?(?:\d+(?:\.\d+)?|\.\d+)")  # once `$` and commas are dropped
# "answer is B", "Answer: (B)"; a small letter only in brackets ("answer is (b)"): "the answer
# is a bit unclear" names no choice
LETTER_NAMED = r"\s*[:\-]?\s*(?:[\(\[]([a-j])[\)\]]|[\(\[]?([A-J])[\)\]]?)(?![A-Za-z0-9])"
ANSWER_IS = re.compile(r"(?i:\banswer(?:\s+is)?)" + LETTER_NAMED)
# "Option B is correct", "I choose choice (C)": read only where no "answer is" names a letter, as
# "Option A is wrong, so the answer is B" names B
OPTION_IS = re.compile(r"(?i:\b(?:option|choice)(?:\s+is)?)" + LETTER_NAMED)
# Minus signs other than the hyphen-minus that people and models write before a number (U+2212,
# its full-width and small forms): read as "-", else "−5" would be read as 5.
MINUS_SIGNS = str.maketrans({"\u2212": "-", "\uff0d": "-", "\ufe63": "-"})
LETTER_MARKER = re.compile(r"^[\(\[]?([A-Ja-j])[\)\]\.:](?:\s|$)")


@dataclass(frozen=True)
class Gold:
    qid: str
    answer: str
    choices: Optional[Mapping[str, str]] = None  # letter (or "11", ...) -> choice text, for multiple choice


@dataclass(frozen=True)
class Scored:
    """One gold question's outcome. status: correct, wrong, invalid (an answer, nothing
    extracted) or missing (no answer for this id, or a null one)."""
    qid: str
    group: str
    gold: str
    rule: str
    extracted: Optional[str]
    status: str
    raw: Optional[str]

    @property
    def correct(self) -> bool:
        return self.status == "correct"


@dataclass(frozen=True)
class Tally:
    n: int
    correct: int
    invalid: int
    missing: int

    @property
    def accuracy(self) -> Optional[float]:
        return self.correct / self.n if self.n else None

    @property
    def stderr(self) -> Optional[float]:
        return accuracy_stderr(self.correct, self.n)


def accuracy_stderr(correct: int, n: int) -> Optional[float]:
    """lm-evaluation-harness's mean_stderr of n 0/1 scores: sqrt(p(1-p)/(n-1)); None below 2."""
    if n < 2:
        return None
    p = correct / n
    return math.sqrt(p * (1 - p) / (n - 1))


@functools.lru_cache(maxsize=None)
def _punctuation_table() -> dict[int, None]:
    # Every Unicode punctuation character, as the harness's ignore_punctuation builds it; built on
    # first use (a quarter of a second), not at import.
    return {i: None for i in range(sys.maxunicode + 1) if unicodedata.category(chr(i)).startswith("P")}


def strip_punctuation(text: str) -> str:
    return text.translate(_punctuation_table())


def parse_number(text: str) -> Optional[Decimal]:
    """"1,000", "$18", "18.0", "18.", ".5" -> a Decimal; anything else -> None."""
    cleaned = _clean_number(text)
    if not PLAIN_NUMBER.fullmatch(cleaned):
        return None
    try:
        return Decimal(cleaned)
    except InvalidOperation:  # not reachable through the pattern above; kept as a guard
        return None


def extract_number(text: str) -> Optional[str]:
    """GSM8K's rule: `#### N` if present, else the last number. Returned cleaned ("$1,000.50" ->
    "1000.50"); None when the text holds no number."""
    text = text.translate(MINUS_SIGNS)
    for found in STRICT_NUMBER.findall(text):
        if parse_number(found) is not None:
            return _clean_number(found)
    numbers = NUMBER.findall(text)
    return _clean_number(numbers[-1]) if numbers else None


def _clean_number(text: str) -> str:
    return text.translate(MINUS_SIGNS).strip().replace(",", "").replace("$", "").rstrip(".")


def extract_letter(text: str, letters: str = LETTERS, choices: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """A multiple-choice answer's letter (see the module docstring for the order of the rules)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    bare = strip_punctuation(first).strip().upper()
    if len(bare) == 1 and bare in letters:
        return bare
    marker = LETTER_MARKER.match(first)
    if marker and marker.group(1).upper() in letters:
        return marker.group(1).upper()
    for named in (ANSWER_IS, OPTION_IS):
        for found in named.finditer(text):
            letter = (found.group(1) or found.group(2)).upper()
            if letter in letters:
                return letter
    if choices and first:
        same = [k for k, v in choices.items() if normalise_text(str(v)) == normalise_text(first)]
        if same:  # equal choices: the first, as a tie's pick is
            return same[0]
    return None


def normalise_text(text: str) -> str:
    """Stripped, case-folded, inner whitespace collapsed, trailing punctuation removed."""
    text = " ".join(text.split()).casefold()
    while text and (unicodedata.category(text[-1]).startswith("P") or text[-1].isspace()):
        text = text[:-1]
    return text


def gold_letter(answer: str, letters: str = LETTERS) -> Optional[str]:
    """The letter a gold answer names ("B", " (B) "), or None."""
    bare = strip_punctuation(answer).strip()
    return bare if len(bare) == 1 and bare in letters else None


def own_letters(choices: Mapping[str, str]) -> str:
    """A record's labels of one character (A-D; ARC's 1-4): the ones an answer names alone."""
    return "".join(sorted(k for k in choices if len(k) == 1))


def choice_named(text: str, choices: Mapping[str, str]) -> Optional[str]:
    """The key of the choice whose text `text` is: written as it is, else stripped, else as
    normalise_text leaves both; of choices equal at the first of these that finds one, the
    first (lm-eval's pick of equal scores is the first too). None for an empty text."""
    if not text.strip():
        return None
    for same in (lambda c: c == text, lambda c: c.strip() == text.strip(),
                 lambda c: normalise_text(c) == normalise_text(text)):
        for key, choice in choices.items():
            if same(choice):
                return key
    return None


def gold_key(gold: Gold) -> tuple[str, bool]:
    """(what a letter-rule answer must equal, whether the gold answer names a choice by its
    text): a letter of the record's, else the key of the choice the gold answer is the text of,
    else the gold answer as written (upper-cased)."""
    letter = gold_letter(gold.answer, LETTERS + own_letters(gold.choices or {}))
    if letter and (not gold.choices or letter in gold.choices):
        return letter, False
    named = choice_named(gold.answer, gold.choices) if gold.choices else None
    if named is not None:
        return named, True
    return letter or gold.answer.strip().upper(), False


def extract_choice(text: str, gold: Gold) -> Optional[str]:
    """The letter rule: a letter (extract_letter), or for a record whose gold answer is a
    choice's text, the choice the answer is the text of before any letter read from it."""
    if not gold.choices:
        return extract_letter(text, LETTERS)
    letters = own_letters(gold.choices)
    if gold_key(gold)[1]:
        named = choice_named(text, gold.choices)
        if named is not None:
            return named
    return extract_letter(text, letters, gold.choices)


def auto_rule(gold: Gold) -> str:
    """letter for multiple choice (choices, or a gold letter A-J), number for numeric gold, else exact."""
    if gold.choices or gold_letter(gold.answer):
        return "letter"
    if parse_number(gold.answer) is not None:
        return "number"
    return "exact"


def extract(text: str, rule: str, gold: Gold, pattern: Optional[re.Pattern[str]] = None) -> Optional[str]:
    """What `rule` takes from an answer text (None: nothing; the answer is invalid)."""
    if rule == "number":
        return extract_number(text)
    if rule == "letter":
        return extract_choice(text, gold)
    if rule == "exact":
        return normalise_text(text) if text.strip() else None
    if rule != "regex" or pattern is None:
        raise ValueError(f"unknown extraction rule {rule!r} (or a regex rule without its pattern)")
    found = pattern.search(text)
    if found is None:
        return None
    return (found.group(1) if pattern.groups else found.group(0)) or ""


def matches(extracted: str, gold: Gold, rule: str) -> bool:
    """Whether an extracted answer equals the gold one under `rule`."""
    if rule == "letter":
        return extracted == gold_key(gold)[0]
    if rule in ("number", "regex"):
        got, want = parse_number(extracted), parse_number(gold.answer)
        if got is not None and want is not None:
            return got == want
        if rule == "number":
            return False
    return normalise_text(extracted) == normalise_text(gold.answer)


def score_one(gold: Gold, answer: Optional[str], rule: str, group: str,
              pattern: Optional[re.Pattern[str]] = None) -> Scored:
    """Score one gold question under `rule` (auto, number, letter, exact, or regex with its
    `pattern`); `answer` None means there is no answer for it."""
    chosen = auto_rule(gold) if rule == "auto" else rule
    if answer is None:
        return Scored(gold.qid, group, gold.answer, chosen, None, "missing", None)
    extracted = extract(answer, chosen, gold, pattern)
    if extracted is None:
        return Scored(gold.qid, group, gold.answer, chosen, None, "invalid", answer)
    status = "correct" if matches(extracted, gold, chosen) else "wrong"
    return Scored(gold.qid, group, gold.answer, chosen, extracted, status, answer)


def group_of(qid: str, pattern: Optional[re.Pattern[str]]) -> str:
    """The group a question id belongs to under `--by`: the pattern's first group (or whole match)
    searched in the id; ids it does not match are '(other)'."""
    if pattern is None:
        return "all"
    found = pattern.search(qid)
    if found is None:
        return "(other)"
    return (found.group(1) if pattern.groups else found.group(0)) or "(empty)"


def tally(scored: Iterable[Scored]) -> Tally:
    counts = Counter(s.status for s in scored)
    return Tally(sum(counts.values()), counts["correct"], counts["invalid"], counts["missing"])


def by_group(scored: Sequence[Scored]) -> dict[str, Tally]:
    """One tally per group, groups sorted by name."""
    groups: dict[str, list[Scored]] = {}
    for s in scored:
        groups.setdefault(s.group, []).append(s)
    return {name: tally(groups[name]) for name in sorted(groups)}
