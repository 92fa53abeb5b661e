"""The scheduler and stop rules are pure: tested with no model."""

from array import array

import pytest

from ggbatch.workers.engine.scheduler import Scheduler
from ggbatch.workers.engine.sequence import Phase, Sequence, find_stop
from ggbatch.workers.protocol import GenerationParams, Question


def seq(qid, n_prompt):
    return Sequence(Question(qid, array("i", range(1, n_prompt + 1)), 0))


def test_admission_fills_free_slots_in_order():
    s = Scheduler(slots=2, n_batch=64)
    a, b, c = seq("a", 5), seq("b", 5), seq("c", 5)
    for x in (a, b, c):
        s.add(x)
    assert s.admit() == [a, b]
    assert (a.seq_id, b.seq_id) == (0, 1)
    assert c.phase is Phase.WAITING and s.n_unfinished == 3


def test_shared_prefix_is_counted_as_cached():
    s = Scheduler(slots=1, n_batch=64, prefix=array("i", [1, 2, 3]))
    a = seq("a", 5)
    s.add(a)
    s.admit()
    assert a.n_cached == 3


def test_at_least_one_prompt_token_is_decoded():
    # Even a prompt that is all shared prefix decodes its last token itself: its logits are needed.
    for prefix, prompt in (([1, 2, 3], [1, 2, 3]), ([1, 2, 9], [1, 2, 3, 4])):
        s = Scheduler(slots=1, n_batch=64, prefix=array("i", prefix))
        a = Sequence(Question("a", array("i", prompt), 0))
        s.add(a)
        s.admit()
        assert a.n_cached == 2


def test_decode_tokens_first_then_prefill_chunks_within_budget():
    s = Scheduler(slots=3, n_batch=10)
    a, b, c = seq("a", 4), seq("b", 20), seq("c", 20)
    for x in (a, b, c):
        s.add(x)
    s.admit()
    a.phase, a.output = Phase.DECODE, [7]
    spans = s.schedule()
    assert [(sp.seq.question.qid, sp.start_pos, sp.n, sp.wants_logits) for sp in spans] == [
        ("a", 4, 1, True), ("b", 0, 9, False)]  # chunked prefill: c waits for room
    assert sum(sp.n for sp in spans) == 10


def test_without_mixing_prompt_steps_and_decode_steps_alternate():
    s = Scheduler(slots=2, n_batch=16, stream_per_sequence=True)
    a, b = seq("a", 4), seq("b", 6)
    s.add(a)
    s.add(b)
    s.admit()
    a.phase, a.output = Phase.DECODE, [7]
    assert [(sp.seq.question.qid, sp.n) for sp in s.schedule()] == [("b", 6)]  # prompt only
    b.phase, b.output = Phase.DECODE, [8]
    assert [(sp.seq.question.qid, sp.n) for sp in s.schedule()] == [("a", 1), ("b", 1)]


def test_last_prompt_chunk_asks_for_logits():
    s = Scheduler(slots=1, n_batch=8)
    a = seq("a", 12)
    s.add(a)
    s.admit()
    a.n_cached = 8
    (span,) = s.schedule()
    assert (span.start_pos, span.n, span.wants_logits) == (8, 4, True)


def test_release_refills_slot_next_admission():
    s = Scheduler(slots=1, n_batch=8)
    a, b = seq("a", 3), seq("b", 3)
    s.add(a)
    s.add(b)
    s.admit()
    s.release(a)
    assert s.admit() == [b] and b.seq_id == 0


def four_added(slots, per_stream=False):
    """A scheduler with `slots` slots and four 3-token questions a, b, c, d admitted in order."""
    s = Scheduler(slots=slots, n_batch=8, stream_per_sequence=per_stream)
    seqs = [seq(qid, 3) for qid in "abcd"]
    for x in seqs:
        s.add(x)
    s.admit()
    return s, seqs


def test_admission_takes_the_lowest_free_id():
    s, (a, b, c, d) = four_added(slots=3)
    s.release(c)
    s.release(a)
    assert s.admit() == [d] and d.seq_id == 0


def test_batches_list_sequences_by_id_not_by_admission():
    # llama.cpp puts only consecutive ids into one pass over the weights (per-sequence streams).
    s, (a, b, c, d) = four_added(slots=3, per_stream=True)
    s.release(a)
    s.admit()  # d takes id 0, admitted after b and c
    for x in (b, c, d):
        x.phase, x.output = Phase.DECODE, [7]
    assert [(sp.seq.question.qid, sp.seq.seq_id) for sp in s.schedule()] == [("d", 0), ("b", 1), ("c", 2)]


@pytest.mark.parametrize("per_stream", [True, False])
def test_compact_moves_the_highest_sequence_into_a_gap_only_with_streams(per_stream):
    s, (a, b, c, d) = four_added(slots=4, per_stream=per_stream)
    s.release(a)
    s.release(c)  # ids 0 and 2 free, b at 1, d at 3
    if not per_stream:  # one pool: ids do not matter to llama.cpp, nothing moves
        assert s.compact() == []
        return
    assert s.compact() == [(d, 3)] and (b.seq_id, d.seq_id) == (1, 0)
    assert sorted(s.free_ids) == [2, 3] and s.compact() == []  # contiguous: nothing more to move


def test_compact_leaves_gaps_that_waiting_questions_fill():
    s, (a, b, c, d) = four_added(slots=3, per_stream=True)
    s.release(a)
    assert s.admit() == [d] and d.seq_id == 0
    assert s.compact() == []


def test_preempt_newest_goes_back_to_front():
    s = Scheduler(slots=2, n_batch=8)
    a, b, c = seq("a", 3), seq("b", 3), seq("c", 3)
    for x in (a, b, c):
        s.add(x)
    s.admit()
    b.output = [5]
    assert s.preempt_newest() == (b, 1)  # and the slot whose KV the engine frees
    assert b.phase is Phase.WAITING and b.output == [] and list(s.waiting) == [b, c]
    assert s.free_ids == [1]


def test_drop_waiting_forgets_what_was_not_admitted():
    s = Scheduler(slots=1, n_batch=8)
    for x in (seq("a", 3), seq("b", 3), seq("c", 3)):
        s.add(x)
    s.admit()
    assert s.drop_waiting() == 2 and s.n_unfinished == 1


def test_kv_budget_limits_admission_until_cells_are_released():
    s = Scheduler(slots=4, n_batch=64, kv_budget=30, max_new_tokens=5)
    a, b, c = seq("a", 10), seq("b", 10), seq("c", 10)  # each needs 10 + 5 cells
    for x in (a, b, c):
        s.add(x)
    assert s.admit() == [a, b] and s.kv_reserved == 30
    s.release(a)
    assert s.admit() == [c]


def test_a_sequence_larger_than_the_budget_still_runs_alone():
    s = Scheduler(slots=2, n_batch=64, kv_budget=5, max_new_tokens=5)
    a = seq("a", 10)
    s.add(a)
    assert s.admit() == [a]


def test_slots_cannot_exceed_batch():
    with pytest.raises(ValueError):
        Scheduler(slots=16, n_batch=8)


@pytest.mark.parametrize("text,stops,start,expected", [
    ("hello world", ["wor"], 0, 6),
    ("hello world", ["o", "l"], 0, 2),
    ("hello world", ["x"], 0, None),
    ("abcabc", ["abc"], 1, 3),
])
def test_find_stop(text, stops, start, expected):
    assert find_stop(text, stops, start) == expected


def test_a_stop_string_is_found_and_cut_in_one_decoding_of_the_bytes():
    """Bad bytes before a stop string (a stray byte token, a lead byte left alone) are replaced
    as the answer's text replaces them, so the cut falls where the stop string begins."""
    seq = Sequence(Question("q", array("i", [1, 2]), 0))
    seq.phase = Phase.DECODE
    gen = GenerationParams(max_tokens=50, stop=("END",))
    pieces = [b"ab", b"\xff", b"cd", b"\xe6", b"x", b"END"]
    assert [seq.accept(10 + t, p, False, gen, 1000) for t, p in enumerate(pieces)][-1]
    assert seq.text() == "ab\ufffdcd\ufffdx"


def test_a_question_with_its_own_max_tokens_reserves_that_many_cells():
    from ggbatch.workers.protocol import GenerationParams

    s = Scheduler(slots=4, n_batch=64, kv_budget=45, max_new_tokens=5)  # 5 each: all three would fit
    short = Sequence(Question("a", array("i", range(1, 11)), 0, GenerationParams(max_tokens=2)))  # 10 + 2
    long = Sequence(Question("b", array("i", range(1, 11)), 0, GenerationParams(max_tokens=20)))  # 10 + 20
    plain = seq("c", 10)  # 10 + the job's 5
    for x in (short, long, plain):
        s.add(x)
    assert s.admit() == [short, long] and s.kv_reserved == 42  # the plain one (15 more) waits


# -- prompt steps shaped for llama.cpp's ubatch split (workers/engine/ubatches.py) ----------------------

def _spans(s):
    return [(sp.seq.seq_id, sp.start_pos, sp.n) for sp in s.schedule()]


def own(i, n_prompt):
    """A prompt sharing nothing with own(j, ...) for j != i (the prefix cache finds nothing)."""
    return Sequence(Question(f"q{i}", array("i", range(1000 * (i + 1), 1000 * (i + 1) + n_prompt)), 0))


def _cache_scheduler(slots, n_batch):
    from ggbatch.workers.engine.prefix_cache import SlotContents

    return Scheduler(slots=slots, n_batch=n_batch, stream_per_sequence=True,
                     contents=SlotContents(array("i"), slots, False))


def test_chunk_len_takes_whole_prompts_and_never_a_thin_piece():
    from ggbatch.workers.engine.ubatches import chunk_len

    assert chunk_len(100, 512) == 100  # fits: all of it, however short
    assert chunk_len(550, 512) == 486  # would leave 38: leaves 64 instead
    assert chunk_len(1000, 512) == 512
    assert chunk_len(300, 50) == 0  # a 50-token piece would be a thin ubatch of its own
    assert chunk_len(100, 90) == 0  # 36 leaving 64, or 90 leaving 10: neither
    assert chunk_len(300, 50, min_chunk=1) == 50


def test_prompt_chunks_listed_so_each_sequence_is_one_ubatch():
    from ggbatch.workers.engine.ubatches import passes

    s = _cache_scheduler(slots=6, n_batch=512)
    lens = [38, 159, 109, 76, 47, 83]
    for i, n in enumerate(lens):
        s.add(own(i, n))
    s.admit()
    spans = s.schedule()
    assert [(sp.seq.seq_id, sp.n) for sp in spans] == [(i, n) for i, n in reversed(list(enumerate(lens)))]
    assert passes(spans, 512) == [(1, n) for n in reversed(lens)]
    # Listed by id, llama.cpp would cut the same tokens into six thin ubatches.
    assert passes(sorted(spans, key=lambda sp: sp.seq.seq_id), 512) == [
        (6, 38), (5, 9), (3, 29), (2, 33), (1, 50), (1, 36)]


def test_equal_chunks_of_consecutive_sequences_make_one_ubatch():
    from ggbatch.workers.engine.ubatches import passes

    s = _cache_scheduler(slots=5, n_batch=512)
    for i, n in enumerate([80, 80, 80, 50, 90]):
        s.add(own(i, n))
    s.admit()
    spans = s.schedule()
    assert [(sp.seq.seq_id, sp.n) for sp in spans] == [(4, 90), (3, 50), (0, 80), (1, 80), (2, 80)]
    assert passes(spans, 512) == [(1, 90), (1, 50), (3, 80)]


def test_a_long_prompt_leaves_a_full_chunk_and_a_thin_piece_waits():
    s = _cache_scheduler(slots=2, n_batch=512)
    a, b = own(0, 550), own(1, 300)
    s.add(a)
    s.add(b)
    s.admit()
    assert _spans(s) == [(0, 0, 486)]  # not 512 (38 left), and b's 26-token piece waits
    a.n_cached = 486
    assert _spans(s) == [(1, 0, 300), (0, 486, 64)]


def test_a_small_retry_budget_still_makes_progress():
    s = _cache_scheduler(slots=1, n_batch=512)
    a = seq("a", 400)
    s.add(a)
    s.admit()
    assert [(sp.seq.seq_id, sp.n) for sp in s.schedule(budget=40)] == [(0, 40)]


def test_without_the_prefix_cache_prompt_steps_are_listed_by_id():
    s = Scheduler(slots=2, n_batch=512, stream_per_sequence=True)
    a, b = seq("a", 550), seq("b", 30)
    s.add(a)
    s.add(b)
    s.admit()
    assert _spans(s) == [(0, 0, 512)]
    a.n_cached = 512
    assert _spans(s) == [(0, 512, 38), (1, 0, 30)]
