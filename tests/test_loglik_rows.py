"""Log-likelihood bookkeeping without a model (workers/engine/loglik.py): which sequences score a
question's continuations, which logits rows they read, and the scores put back under each
continuation's index, on synthetic logits."""

from array import array

import numpy as np
import pytest

from ggbatch.workers.engine import loglik
from ggbatch.workers.protocol import Question, Scored

VOCAB = 12


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


def question(*continuations: list[int]) -> Question:
    return Question("q", array("i", [1, 2, 3]), 0, continuations=tuple(array("i", c) for c in continuations))


def score(q: Question, rows: np.ndarray):
    """Each sequence's needed rows read from `rows` (row p: the logits after position p), then
    finished: the question's Answer."""
    _, seqs = loglik.sequences(q)
    answer = None
    for seq in seqs:
        lo, hi = loglik.logit_range(seq, 0, seq.n_prompt)
        loglik.read_rows(seq, lo, rows[lo:hi])
        answer = loglik.finished(seq, 0, None) or answer
    return seqs, answer


def test_one_token_continuations_ride_on_the_first_longer_one():
    q = question([5], [6, 7], [], [8], [9, 10])
    seqs, _ = score(q, np.random.default_rng(0).normal(size=(8, VOCAB)).astype(np.float32))
    # a continuation's last token is a target, never fed: no row reads its logits
    assert [list(s.prompt) for s in seqs] == [[1, 2, 3, 6], [1, 2, 3, 9]]
    assert seqs[0].scoring.alternatives == ((0, 5), (3, 8)) and seqs[1].scoring.alternatives == ()


def test_every_continuation_scored_under_its_own_index():
    rows = np.random.default_rng(1).normal(size=(8, VOCAB)).astype(np.float32)
    rows[2, 8] = 9.0  # the context's last row: token 8 is its argmax
    _, answer = score(question([5], [6, 7], [], [8]), rows)
    ctx_row = log_softmax(rows[2])
    want = [ctx_row[5], ctx_row[6] + log_softmax(rows[3])[7], 0.0, ctx_row[8]]
    assert [s.logprob for s in answer.scored] == pytest.approx(want)
    assert [s.is_greedy for s in answer.scored] == [False, False, True, True]
    assert [len(s.token_logprobs) for s in answer.scored] == [1, 2, 0, 1]


def test_of_tokens_tied_at_a_rows_top_only_the_first_is_greedy():
    # lm-eval's is_greedy is logits.argmax() == the token, and argmax takes the first of a tie (a
    # random-weight model's row after BOS can be all zeros): one-token continuations read from the
    # context's row, and a longer one's tokens each from its own row
    rows = np.zeros((8, VOCAB), dtype=np.float32)
    _, answer = score(question([0], [3], [7], [0, 0], [5, 0]), rows)
    assert [s.is_greedy for s in answer.scored] == [True, False, False, True, False]


def test_all_one_token_continuations_are_one_sequence_of_the_context():
    rows = np.random.default_rng(2).normal(size=(4, VOCAB)).astype(np.float32)
    seqs, answer = score(question([4], [5], [4], [11]), rows)
    assert len(seqs) == 1 and list(seqs[0].prompt) == [1, 2, 3]
    assert loglik.logit_range(seqs[0], 0, 3) == (2, 3)  # the context's last row only
    ctx_row = log_softmax(rows[2])
    assert [s.logprob for s in answer.scored] == pytest.approx([ctx_row[4], ctx_row[5], ctx_row[4], ctx_row[11]])


def test_a_row_read_again_after_a_preemption_writes_over_the_first_reading():
    q = question([5], [6])
    _, seqs = loglik.sequences(q)
    first = np.zeros((1, VOCAB), np.float32)
    again = np.random.default_rng(3).normal(size=(1, VOCAB)).astype(np.float32)
    loglik.read_rows(seqs[0], 2, first)
    loglik.read_rows(seqs[0], 2, again)
    answer = loglik.finished(seqs[0], 0, None)
    assert answer is not None
    assert [s.logprob for s in answer.scored] == pytest.approx([log_softmax(again[0])[5], log_softmax(again[0])[6]])


def test_equal_choice_texts_take_the_first_ones_score_and_the_first_wins():
    """Rows that round two equal continuations apart (another batch row) still give equal texts one
    score: the first's, so the pick and choice_logprobs agree."""
    scored = (Scored(-2.0, (-2.0,), False), Scored(-3.0, (-3.0,), False), Scored(-1.5, (-1.5,), True))
    assert loglik.alike(("12", "4", "12"), scored) == (scored[0], scored[1], scored[0])
    assert loglik.pick_text(("12", "4", "12"), loglik.alike(("12", "4", "12"), scored)) == "12"
    assert loglik.alike(("a", "b"), scored) == scored  # not one per choice: as it is
