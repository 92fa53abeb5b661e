"""maj@k and pass@k over questions answered with several samples (sampling.n). Pure functions.

- maj@k: the first k samples' extracted answers voted on (lm-evaluation-harness's `take_first_k`
  then `majority_vote` filters: `Counter(...).most_common(1)`, so a tie goes to the answer that
  came first). A vote is on what the rule compares, not on the text extracted: numbers as
  decimals ("18", "18.0" and "18.00" are one vote, where the harness's strings would be three),
  exact and regex texts as normalised; a sample with nothing extracted votes as one value
  ("[invalid]" there), and a question whose vote is that value is wrong. The winner is scored as
  a single answer is.
- pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code"), with n samples of which c are correct: 1 - C(n-c, k) / C(n, k), computed as their
  numerically stable product, as lm-eval's code_eval metric computes it; averaged over questions.

Both are over every gold question, as the accuracy is: a question without an answer (none, null,
failed) is wrong, and one answered once (a file mixing single answers and samples) is its one
sample: its vote is that answer, and its pass@k is whether it is right.

The main accuracy of a score stays the first sample's: what the question gets with n = 1.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Sequence, TypeVar, Union

from .rules import Gold, auto_rule, extract, matches, normalise_text, parse_number

INVALID = "[invalid]"  # lm-eval's regex filter's value for an answer it extracts nothing from
V = TypeVar("V", bound=Hashable)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn from n, c of them correct, is correct."""
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def majority(votes: Sequence[V]) -> V:
    """The most frequent value; of equals, the first to appear (collections.Counter keeps insertion
    order, as lm-eval's majority_vote relies on)."""
    return Counter(votes).most_common(1)[0][0]


def vote_key(extracted: Optional[str], rule: str) -> Hashable:
    """What a sample votes for: the value `matches` compares under `rule` (Decimals of equal value
    are equal keys: 18 and 18.00 are one vote)."""
    if extracted is None:
        return INVALID
    if rule in ("number", "regex"):
        number = parse_number(extracted)
        if number is not None:
            return ("number", number)
    return ("text", normalise_text(extracted) if rule in ("exact", "regex") else extracted)


@dataclass(frozen=True)
class SampleScores:
    questions: int  # every gold question: the accuracy's denominator
    sampled: int  # of them, answered with several samples
    single: int  # answered once: a vote of one
    unanswered: int  # no answer (none, null, failed): wrong
    k: int  # samples per question (the fewest any sampled question has)
    maj_correct: int  # questions whose majority vote over k samples is correct
    pass_at: dict[int, float]  # k -> mean pass@k over every question

    @property
    def maj(self) -> float:
        return self.maj_correct / self.questions if self.questions else 0.0


def samples_of(answer: Union[str, list[Optional[str]], None]) -> list[Optional[str]]:
    """A question's answers as samples: none, one, or its list."""
    if answer is None:
        return []
    return answer if isinstance(answer, list) else [answer]


def score_samples(gold: Sequence[Gold], answers: Mapping[str, Union[str, list[Optional[str]], None]], rule: str,
                  pattern: Optional[re.Pattern[str]] = None) -> Optional[SampleScores]:
    """maj@k and pass@k (k = 1 and the samples per question) over every gold question, when
    some answer has several samples (None when none has)."""
    texts = {g.qid: samples_of(answers.get(g.qid)) for g in gold}
    if not any(len(t) > 1 for t in texts.values()):
        return None
    k = min(len(t) for t in texts.values() if len(t) > 1)
    maj = 0
    passes: dict[int, float] = {1: 0.0, k: 0.0}
    for g in gold:
        if not texts[g.qid]:
            continue
        chosen = auto_rule(g) if rule == "auto" else rule
        extracted = [None if t is None else extract(t, chosen, g, pattern) for t in texts[g.qid]]  # None: invalid
        right = sum(e is not None and matches(e, g, chosen) for e in extracted)
        maj += _vote_is_right(extracted[:k], g, chosen)
        for kk in passes:
            passes[kk] += pass_at_k(len(extracted), right, min(kk, len(extracted)))
    counts = Counter(min(len(t), 2) for t in texts.values())
    return SampleScores(len(gold), counts[2], counts[1], counts[0], k, maj,
                        {kk: v / len(gold) for kk, v in sorted(passes.items())})


def _vote_is_right(extracted: Sequence[Optional[str]], gold: Gold, rule: str) -> bool:
    """Whether the majority vote over these samples is right: the first sample of the winning
    value is scored as a single answer."""
    keys = [vote_key(e, rule) for e in extracted]
    winner = extracted[keys.index(majority(keys))]
    return winner is not None and matches(winner, gold, rule)
