"""The prefix cache's bookkeeping (workers/engine/prefix_cache.py) and the scheduler's admission with it:
pure, no model."""

from array import array

from ggbatch.workers.engine.invariant import MIN_ROWS
from ggbatch.workers.engine.prefix_cache import MIN_WAIT_GAIN, SlotContents, Start, shared_len
from ggbatch.workers.engine.scheduler import Scheduler
from ggbatch.workers.engine.sequence import Phase, Sequence, common_prefix_len
from ggbatch.workers.protocol import Question

PREFIX = array("i", range(1, 6))  # 5 tokens every prompt starts with
PREFIX_ID = 4


def prompt(passage: int, question: int, n_passage: int = 100) -> array:
    return array("i", [*PREFIX, *range(1000 * passage, 1000 * passage + n_passage), 900000 + question])


def running(slot: int, tokens: array, n_cached: int) -> Sequence:
    seq = Sequence(Question(f"r{slot}", tokens, 0))
    seq.admit(slot, 0)
    seq.n_cached = n_cached
    if n_cached == len(tokens):
        seq.phase = Phase.DECODE
    return seq


def test_a_waiting_prompts_common_prefixes_are_remembered_by_the_held_array_itself():
    known: dict = {}
    mine, held, again = prompt(1, 0), prompt(1, 3), prompt(2, 0)
    assert shared_len(mine, held, known) == common_prefix_len(mine, held) == 105
    assert shared_len(mine, again, known) == 5
    assert len(known) == 2 and known[id(held)] == (held, 105)
    # an equal array is another held prompt: its own entry, the same length; the one remembered
    # is kept alive beside its length, so its id is never another array's while it is there
    twin = array("i", held)
    assert shared_len(mine, twin, known) == 105 and known[id(twin)][0] is twin and len(known) == 3
    known[id(twin)] = (held, 7)  # an entry under this id for another array is not believed
    assert shared_len(mine, twin, known) == 105


def test_a_new_prompt_starts_from_the_longest_prefix_held_anywhere():
    cache = SlotContents(PREFIX, PREFIX_ID, batch_invariant=False)
    assert cache.start(prompt(1, 0), 0, []) == Start(PREFIX_ID, 5)  # only the job's prefix
    cache.keep(2, prompt(1, 7), len(prompt(1, 7)))  # a finished question on passage 1 left its prompt in slot 2
    assert cache.start(prompt(1, 0), 0, []) == Start(2, 105)
    # a running sequence on passage 1 that has only computed part of its prompt offers that part
    assert cache.start(prompt(1, 0), 0, [running(1, prompt(1, 8), 50)]) == Start(2, 105)
    assert cache.start(prompt(3, 0), 0, [running(1, prompt(3, 8), 50)]) == Start(1, 50)


def test_its_own_slot_wins_a_tie_and_at_least_one_token_is_left_to_compute():
    cache = SlotContents(PREFIX, PREFIX_ID, batch_invariant=False)
    cache.keep(1, prompt(1, 7), len(prompt(1, 7)))
    cache.keep(3, prompt(1, 8), len(prompt(1, 8)))
    assert cache.start(prompt(1, 0), 3, []) == Start(3, 105)  # no copy
    same = prompt(1, 7)
    assert cache.start(same, 0, []).n == len(same) - 1  # its logits must be computed


def test_batch_invariant_leaves_min_rows_to_the_sequence():
    cache = SlotContents(PREFIX, PREFIX_ID, batch_invariant=True)
    cache.keep(1, prompt(1, 7), len(prompt(1, 7)))
    same = prompt(1, 7)
    assert cache.start(same, 0, []).n == len(same) - MIN_ROWS


def test_forget_and_what_is_kept():
    cache = SlotContents(array("i"), PREFIX_ID, batch_invariant=False)
    cache.keep(1, prompt(1, 7), len(prompt(1, 7)))
    assert cache.kept_tokens == len(prompt(1, 7))
    cache.forget(1)
    assert cache.start(prompt(1, 0), 0, []) == Start(-1, 0)


def test_a_question_waits_for_the_passage_another_is_computing():
    cache = SlotContents(PREFIX, PREFIX_ID, batch_invariant=False)
    computing = running(0, prompt(1, 1), 20)
    assert cache.wanted_soon(prompt(1, 2), [computing]) == 105
    assert cache.wanted_soon(prompt(2, 2), [computing]) == 0  # it shares only what is already in
    done = running(0, prompt(1, 1), len(prompt(1, 1)))  # its prompt is in: nothing to wait for
    assert cache.wanted_soon(prompt(1, 2), [done]) == 0


def scheduler(slots=4):
    cache = SlotContents(PREFIX, slots, batch_invariant=False)
    return Scheduler(slots, 512, prefix=PREFIX, max_new_tokens=8, stream_per_sequence=True, contents=cache), cache


def test_admission_lets_other_passages_go_first_while_one_is_computed_once():
    sched, cache = scheduler(slots=4)
    qs = [Sequence(Question(f"p{p}q{j}", prompt(p, j), 0)) for p in (1, 2) for j in range(3)]
    for seq in qs:
        sched.add(seq)
    first = sched.admit()
    # one question per passage starts (from the job's prefix); the others wait for their passage
    assert [s.question.qid for s in first] == ["p1q0", "p2q0"]
    assert all(s.n_cached == 5 and s.source == 4 for s in first)
    for seq in first:  # their prompts go in
        seq.n_cached = seq.n_prompt
        seq.phase = Phase.DECODE
    second = sched.admit()
    assert [s.question.qid for s in second] == ["p1q1", "p1q2"]
    assert [(s.source, s.n_cached) for s in second] == [(first[0].seq_id, 105), (first[0].seq_id, 105)]


def test_without_the_cache_admission_is_in_order_from_the_job_prefix():
    sched = Scheduler(4, 512, prefix=PREFIX, max_new_tokens=8, stream_per_sequence=True)
    for p in (1, 2):
        for j in range(3):
            sched.add(Sequence(Question(f"p{p}q{j}", prompt(p, j), 0)))
    admitted = sched.admit()
    assert [s.question.qid for s in admitted] == ["p1q0", "p1q1", "p1q2", "p2q0"]
    assert {(s.source, s.n_cached) for s in admitted} == {(4, 5)}


def test_waiting_needs_a_gain_worth_an_idle_slot():
    assert MIN_WAIT_GAIN > 1
    sched, cache = scheduler(slots=2)
    short = MIN_WAIT_GAIN - 2  # passages too short to wait for
    for j in range(3):
        sched.add(Sequence(Question(f"q{j}", prompt(1, j, n_passage=short), 0)))
    assert len(sched.admit()) == 2


def test_a_prompt_that_failed_before_it_all_went_in_keeps_only_what_went_in():
    cache = SlotContents(PREFIX, PREFIX_ID, batch_invariant=False)
    cache.keep(1, prompt(1, 7), 50)
    assert cache.start(prompt(1, 0), 0, []) == Start(1, 50)
    cache.keep(2, prompt(2, 7), 0)  # nothing went in: nothing kept
    assert 2 not in cache.kept
