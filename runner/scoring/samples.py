"""maj@k and pass@k over questions answered with several samples (sampling.n). Pure functions.

- maj@k: the first k samples' extracted answers voted on (lm-evaluation-harness's `take_first_k`
  then `majority_vote` filters: `Counter(...).most_common(1)`, so a tie goes to the answer that
  came first); a sample with nothing extracted votes as one value ("[invalid]" there), and a
  question whose vote is that value is wrong. The winner is scored as a single answer is.
- pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code"), with n samples of which c are correct: 1 - C(n-c, k) / C(n, k), computed as their
  numerically stable product, as lm-eval's code_eval metric computes it; averaged over questions.

The main accuracy of a score stays the first sample's: what the question gets with n = 1.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

from .rules import Gold, auto_rule, extract, matches

INVALID = "[invalid]"  # lm-eval's regex filter's value for an answer it extracts nothing from


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn from n, c of them correct, is correct."""
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def majority(votes: Sequence[str]) -> str:
    """The most frequent value; of equals, the first to appear (collections.Counter keeps insertion
    order, as lm-eval's majority_vote relies on)."""
    return Counter(votes).most_common(1)[0][0]


@dataclass(frozen=True)
class SampleScores:
    questions: int  # gold questions answered with samples
    k: int  # samples per question (the fewest any of them has)
    maj_correct: int  # questions whose majority vote over k samples is correct
    pass_at: dict[int, float]  # k -> mean pass@k over those questions

    @property
    def maj(self) -> float:
        return self.maj_correct / self.questions if self.questions else 0.0


def score_samples(gold: Sequence[Gold], answers: Mapping[str, Union[str, list[str], None]], rule: str,
                  pattern: Optional[re.Pattern[str]] = None) -> Optional[SampleScores]:
    """maj@k and pass@k (k = 1 and the samples per question) over the gold questions whose answer
    has several samples; None when none has."""
    sampled = [(g, a) for g in gold if isinstance(a := answers.get(g.qid), list) and len(a) > 1]
    if not sampled:
        return None
    k = min(len(a) for _, a in sampled)
    maj = 0
    passes: dict[int, float] = {1: 0.0, k: 0.0}
    for g, texts in sampled:
        chosen = auto_rule(g) if rule == "auto" else rule
        extracted = [extract(t, chosen, g, pattern) for t in texts]
        right = [e is not None and matches(e, g, chosen) for e in extracted]
        vote = majority([e if e is not None else INVALID for e in extracted[:k]])
        maj += vote != INVALID and matches(vote, g, chosen)
        for kk in passes:
            passes[kk] += pass_at_k(len(texts), sum(right), kk)
    return SampleScores(len(sampled), k, maj, {kk: v / len(sampled) for kk, v in sorted(passes.items())})
