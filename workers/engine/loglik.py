"""Log-likelihood scoring: a question whose continuations are scored, not answered by generating.

    Question(tokens = context, continuations = (c0, c1, ...))
      ─▶ one Sequence per continuation of two tokens or more, its prompt context + ci without ci's
         last token (no row reads that token's logits: it is a target, never fed, as lm-eval's
         models feed (context + continuation)[:-1]), its len(ci) tokens scored; the one-token
         continuations ride on the first sequence (with none longer, the first one-token
         continuation's): they are read from the context's last row
      ─▶ prefill only: the batch asks llama.cpp for the logits of exactly the rows that predict a
         scored token (the context's last token and every continuation token but the last)
      ─▶ each row's log-softmax at the next token, and whether that token is the row's argmax
      ─▶ when every continuation is in: one Answer with a Scored per continuation

The continuations of one context share its KV: the first one's sequence holds a slot for each
of the others, and once its context but the last token is in, they fork from its KV (a copy of
the whole stream, which recurrent memory allows too) and each goes on alone. So a context goes
through the model once, with or without the prefix cache, and each longer continuation costs as
many tokens as it has (the context's last, its own but its last). Where the context is held
already when the first is admitted (the prefix cache: another question's, or a kept slot's), the
others start from that KV as it does instead. A multiple-choice question on letters (MMLU as
lm-eval asks it) is one sequence, the context alone: no copy of the context's KV, no step of its
own for any choice.

Pure bookkeeping and numpy: the engine (workers/llama/engine.py) hands the logits rows in.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from ..protocol import Answer, AnswerSpec, FinishReason, GenerationParams, Question, Scored
from . import invariant
from .answers import rejected
from .constraints import choice_logprobs
from .fits import scored_problem as problem
from .logprobs import log_normalizers
from .scheduler import Span
from .sequence import Sequence

# A scored prompt generates nothing: it reserves no KV beyond its prompt.
NO_GENERATION = GenerationParams(max_tokens=0)


@dataclass(eq=False)
class Scoring:
    """What one sequence scores of a question: its own continuation, `targets`, of which the
    last n prompt tokens are the ones fed (all but its last, or all where the prompt would
    otherwise be a single token), each target's log-probability and greedy flag once its row is
    read (by position, so a preempted sequence computed again writes over them); and
    `alternatives`, other one-token continuations of the question as (index, token), read from the
    same row as its first token: the context's last."""

    parent: "Parent"
    index: int
    n: int
    targets: array[int]
    alternatives: tuple[tuple[int, int], ...] = ()
    logprobs: list[float] = field(default_factory=list)
    greedy: list[bool] = field(default_factory=list)
    alternative_scores: dict[int, Scored] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.logprobs = [0.0] * len(self.targets)
        self.greedy = [False] * len(self.targets)


@dataclass(eq=False)
class Parent:
    """A question whose continuations are being scored."""

    question: Question
    left: int
    results: list[Optional[Scored]]
    t_admit: float = 0.0


def sequences(question: Question, forks: int = 0) -> tuple[Parent, list[Sequence]]:
    """The sequences that score a question's continuations: one per continuation of two tokens
    or more (its prompt the context and the continuation but its last token: carrier), and the
    one-token continuations ride on the first sequence, read on its row of the context's last
    token (with no longer continuation, the first one-token continuation's sequence carries
    them); an empty continuation is scored without the model. Up to `forks` of the others fork
    from the first one's KV (held on it: with_forks); the rest are returned to queue."""
    conts = question.continuations
    parent = Parent(question, len(conts), [None] * len(conts))
    for i, cont in enumerate(conts):
        if not cont:  # the context's tokens took it in (lm-eval scores it so too: nothing, greedy)
            parent.results[i] = Scored(0.0, (), True)
            parent.left -= 1
    longer = [i for i, cont in enumerate(conts) if len(cont) > 1]
    one_token = [i for i, cont in enumerate(conts) if len(cont) == 1]
    carriers = longer or one_token[:1]
    riders = tuple((i, conts[i][0]) for i in one_token if i not in carriers)
    return parent, with_forks([carrier(parent, i, riders if k == 0 else ()) for k, i in enumerate(carriers)], forks)


def with_forks(seqs: list[Sequence], most: int) -> list[Sequence]:
    """The sequences to queue: the first holding up to `most` of the others, to fork from its KV
    once its context but the last token is in (its logits score every continuation's first token,
    so each computes that one itself); none where that leaves nothing to share."""
    if len(seqs) < 2 or most <= 0:
        return seqs
    first = seqs[0]
    assert first.scoring is not None
    fork_at = len(first.context) - 1
    if fork_at < 1:
        return seqs
    first.forks, first.fork_at = seqs[1:1 + most], fork_at
    return [first, *seqs[1 + most:]]


def carrier(parent: Parent, i: int, riders: tuple[tuple[int, int], ...]) -> Sequence:
    """The sequence that scores continuation i: its prompt the context and the continuation but
    its last token, or the whole continuation where that would leave one token (a prompt of a
    single token is what batch-invariant mode takes for a decode step)."""
    question, cont = parent.question, parent.question.continuations[i]
    fed = len(cont) - 1 if len(question.tokens) + len(cont) > 2 else len(cont)
    return Sequence(replace(question, tokens=question.tokens + cont[:fed], continuations=(),
                            generation=NO_GENERATION),
                    scoring=Scoring(parent, i, fed, cont, riders))


def admit(question: Question, n_ctx_seq: int, worker_id: int, spec: Optional[AnswerSpec],
          forks: int = 0) -> tuple[list[Sequence], Optional[Answer]]:
    """The sequences that score a question's continuations (`forks`: how many may fork from the
    first: sequences), or its Answer at once: an error when it cannot be scored, its scores when
    every continuation is empty (scored without the model)."""
    why = problem(question, n_ctx_seq)
    if why is not None:
        return [], rejected(question, worker_id, why)
    parent, seqs = sequences(question, forks)
    return seqs, (answer(parent, worker_id, spec) if not seqs else None)


def logit_range(seq: Sequence, start_pos: int, n: int) -> tuple[int, int]:
    """[lo, hi) offsets within a prompt chunk of n tokens from start_pos whose logits a scored
    sequence needs: the rows from its context's last token to the one that predicts its last target."""
    assert seq.scoring is not None
    lo = max(seq.scored_from, start_pos)
    hi = min(seq.scored_from + len(seq.scoring.targets), start_pos + n)
    return (lo - start_pos, hi - start_pos) if hi > lo else (0, 0)


def read_rows(seq: Sequence, start_pos: int, logits: np.ndarray) -> None:
    """Score the tokens predicted by `logits`, the rows of positions start_pos, start_pos + 1, ...
    (each row predicts the token at the next position; the context's last row also the one-token
    continuations)."""
    scoring = seq.scoring
    assert scoring is not None
    first = start_pos - seq.scored_from  # the target the first of these rows predicts
    targets = np.frombuffer(scoring.targets, dtype=np.int32)[first:first + len(logits)]
    logprobs, greedy = token_scores(logits, targets)
    for k, (lp, g) in enumerate(zip(logprobs.tolist(), greedy.tolist())):
        scoring.logprobs[first + k] = lp
        scoring.greedy[first + k] = g
    k = -first  # the context's last row, within these
    if scoring.alternatives and 0 <= k < len(logits):
        indices, tokens = zip(*scoring.alternatives)
        logprobs, greedy = row_scores(logits[k], np.array(tokens))
        for i, lp, g in zip(indices, logprobs.tolist(), greedy.tolist()):
            scoring.alternative_scores[i] = Scored(lp, (lp,), g)


def read_batch(scored: list[tuple[Span, int, int, int]], flags: np.ndarray, logits: np.ndarray) -> None:
    """Score the rows the scored prompts of one batch asked for (`scored`: workers/engine/batch.py
    scored_rows; `flags`: the batch's logits flags; `logits`: its output rows, in batch order)."""
    for span, index, pos, count in scored:
        row = invariant.output_rows(flags, [index])[0]
        read_rows(span.seq, pos, logits[row:row + count])


def all_in(spans: list[Span]) -> list[Sequence]:
    """The scored sequences among these spans whose prompt is all in: they leave at once."""
    return [span.seq for span in spans if span.seq.scoring is not None and span.seq.n_cached >= span.seq.n_prompt]


def token_scores(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the log-softmax at its target token, and whether the target is the row's argmax."""
    top, log_z = log_normalizers(logits)
    picked = logits[np.arange(len(targets)), targets].astype(np.float64)
    greedy = picked >= top
    for i in np.flatnonzero(greedy):
        greedy[i] = first_max(logits[i]) == targets[i]
    return picked - log_z, greedy


def row_scores(row: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row's log-softmax at each of several tokens, and whether each is the row's argmax."""
    top, log_z = log_normalizers(row[None, :])
    picked = row[tokens].astype(np.float64)
    greedy = picked >= top[0]
    if greedy.any():
        greedy &= tokens == first_max(row)
    return picked - log_z[0], greedy


def first_max(row: np.ndarray) -> int:
    """The row's argmax as lm-eval takes it (torch's and numpy's argmax): the first of a tie, so
    that of tokens tied at the top only that one is greedy."""
    return int(np.argmax(row))


def finished(seq: Sequence, worker_id: int, spec: Optional[AnswerSpec]) -> Optional[Answer]:
    """A scored sequence whose prompt is all in: its continuation's result recorded; the question's
    Answer when it was the last (`spec`: the answer's fixed choices, one per continuation)."""
    scoring = seq.scoring
    assert scoring is not None
    parent = scoring.parent
    parent.results[scoring.index] = Scored(float(sum(scoring.logprobs)), tuple(scoring.logprobs), all(scoring.greedy))
    for i, scored in scoring.alternative_scores.items():
        parent.results[i] = scored
    parent.left -= 1 + len(scoring.alternative_scores)
    parent.t_admit = min(parent.t_admit or seq.t_admit, seq.t_admit)
    if parent.left:
        return None
    return answer(parent, worker_id, spec)


def answer(parent: Parent, worker_id: int, spec: Optional[AnswerSpec]) -> Answer:
    """The question's Answer; with fixed choices, its acc and acc_norm picks, and each choice's
    log-likelihood when asked (AnswerSpec.logprobs)."""
    q = parent.question
    n_prompt = len(q.tokens) + sum(len(c) for c in q.continuations)
    took = max(0.0, time.perf_counter() - parent.t_admit) if parent.t_admit else 0.0
    choices = spec.choices if spec is not None else ()
    texts = (spec.texts if spec is not None else ()) or choices
    scored = alike(texts, tuple(r for r in parent.results if r is not None))
    sums = (choice_logprobs(choices, [s.logprob for s in scored]) if spec is not None and spec.logprobs
            and len(choices) == len(scored) else None)
    return Answer(qid=q.qid, text=pick_text(choices, scored), finish_reason=FinishReason.STOP,
                  prompt_tokens=n_prompt, worker_id=worker_id, ttft_s=took, latency_s=took,
                  created=time.time(), choice_logprobs=sums, scored=scored,
                  answer_norm=pick_text(choices, scored, per_char=texts) if choices else None)


def alike(texts: tuple[str, ...], scored: tuple[Scored, ...]) -> tuple[Scored, ...]:
    """Each choice's score, a choice whose text equals an earlier one's given that one's: equal
    texts score the same by definition, though another batch row may round them apart; then a
    tie's first wins."""
    if len(texts) != len(scored):
        return scored
    first: dict[str, int] = {}
    return tuple(scored[first.setdefault(c, i)] for i, c in enumerate(texts))


def pick_text(choices: tuple[str, ...], scored: tuple[Scored, ...], per_char: tuple[str, ...] = ()) -> str:
    """The answer's text: with fixed choices (one continuation each) the one of the highest
    log-likelihood (lm-eval's acc pick; a tie goes to the first, as numpy's argmax), or, given
    the texts scored (`per_char`), of the highest log-likelihood divided by its text's length in
    characters (acc_norm: lm-eval divides by len() of the choice as its task lists it, without
    the target delimiter); else empty."""
    if len(choices) != len(scored) or not scored:
        return ""
    scores = [s.logprob / (len(t) or 1) for t, s in zip(per_char, scored)] if per_char else [s.logprob for s in scored]
    return choices[max(range(len(scores)), key=lambda i: (scores[i], -i))]
