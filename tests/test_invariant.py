"""The batch shapes of batch-invariant mode (workers/engine/invariant.py) are pure rules: tested with no
model. test_engine.py checks on real models that they make answers independent of the batch."""

import random
from array import array

import numpy as np
import pytest

from ggbatch.workers.engine import invariant
from ggbatch.workers.engine.invariant import MIN_ROWS
from ggbatch.workers.engine.scheduler import Scheduler
from ggbatch.workers.engine.sequence import Phase, Sequence
from ggbatch.workers.protocol import EngineConfig, Question, kv_cells


def seq(qid, n_prompt, first=1):
    return Sequence(Question(qid, array("i", range(first, first + n_prompt)), 0))


def arrays(seq_ids, n_logits=None):
    n = len(seq_ids)
    logits = np.ones(n, np.int8) if n_logits is None else np.zeros(n, np.int8)
    if n_logits:
        logits[-n_logits:] = 1
    return (np.arange(100, 100 + n, dtype=np.int32), np.arange(n, dtype=np.int32),
            np.array(seq_ids, np.int32), logits)


def test_prompt_chunks_are_min_rows_or_more_and_leave_min_rows_or_none():
    assert invariant.chunk_len(100, 512) == 100
    assert invariant.chunk_len(5, 512) == 5  # a short prompt, whole
    assert invariant.chunk_len(600, 512) == 512  # 88 left
    assert invariant.chunk_len(515, 512) == 515 - MIN_ROWS  # not 512 with 3 left over
    for remaining in range(MIN_ROWS, 200):
        left, chunks = remaining, []
        while left:
            chunks.append(invariant.chunk_len(left, 2 * MIN_ROWS))
            left -= chunks[-1]
        assert all(MIN_ROWS <= c <= 2 * MIN_ROWS for c in chunks), (remaining, chunks)


def test_a_sequence_keeps_min_rows_prompt_tokens_of_its_own():
    assert invariant.shared_len(common=50, n_prompt=80, n_prefix=50) == 50
    assert invariant.shared_len(common=50, n_prompt=52, n_prefix=50) == 52 - MIN_ROWS
    assert invariant.shared_len(common=5, n_prompt=7, n_prefix=50) == 0  # short prompt: all its own
    assert invariant.shared_len(common=5, n_prompt=80, n_prefix=5) == 0  # short prefix: not shared


def test_a_small_decode_batch_gets_ballast_in_the_ids_right_after_it():
    (tokens, pos, seq_ids, logits), ballast = invariant.lay_out(arrays([0, 1, 2]), limit=MIN_ROWS)
    assert ballast == list(range(3, MIN_ROWS))
    assert list(seq_ids) == list(range(MIN_ROWS)) and list(pos[3:]) == [0] * (MIN_ROWS - 3)
    assert logits.sum() == MIN_ROWS and len(tokens) == MIN_ROWS
    assert invariant.lay_out(arrays(list(range(MIN_ROWS))), limit=MIN_ROWS + 1)[1] == []


def test_ballast_refuses_ids_it_cannot_have():
    with pytest.raises(ValueError, match="not consecutive"):
        invariant.ballast_ids(np.array([0, 2]), limit=64)
    with pytest.raises(ValueError, match="no free sequence id"):
        invariant.ballast_ids(np.array([0, 1]), limit=MIN_ROWS - 1)


def test_a_prompt_chunk_is_left_as_it_is():
    # Fed alone, one logits row at most: the same shape however full the batch would be.
    for n, n_logits in ((20, 1), (20, 0), (5, 1)):
        before = arrays([3] * n, n_logits=n_logits)
        after, ballast = invariant.lay_out(before, limit=64)
        assert ballast == [] and all(np.array_equal(a, b) for a, b in zip(after, before))


def test_logits_rows_are_counted_in_batch_order():
    logits = np.array([0, 1, 0, 0, 1, 1], np.int8)
    assert invariant.output_rows(logits, [1, 4, 5]) == [0, 1, 2]


def test_streams_leave_ballast_room_below_the_prefix():
    assert invariant.kv_streams(64, invariant=True) == 65
    assert invariant.kv_streams(2, invariant=True) == MIN_ROWS + 1
    assert invariant.kv_streams(2, invariant=False) == 3
    assert invariant.prefix_seq_id(2, invariant=True) == MIN_ROWS  # the last stream, above the ballast ids
    assert kv_cells(2, 100, 0, unified=False, batch_invariant=True) == (MIN_ROWS + 1) * 100


def test_invariant_steps_are_one_prompt_chunk_alone_or_every_decode_token():
    s = Scheduler(slots=4, n_batch=32, batch_invariant=True)
    a, b, c = seq("a", 38), seq("b", 5), seq("c", 20)
    for x in (a, b, c):
        s.add(x)
    s.admit()
    steps = []
    while any(x.phase is Phase.PREFILL for x in (a, b, c)):
        (span,) = s.schedule()
        steps.append((span.seq.question.qid, span.n, span.wants_logits))
        span.seq.n_cached += span.n
        if span.seq.n_cached == span.seq.n_prompt:
            span.seq.phase, span.seq.output = Phase.DECODE, [9]
    assert steps == [("a", 38 - MIN_ROWS, False), ("a", MIN_ROWS, True), ("b", 5, True), ("c", 20, True)]
    assert [(sp.seq.seq_id, sp.n) for sp in s.schedule(budget=1)] == [(0, 1), (1, 1), (2, 1)]  # never shrunk


def test_batch_invariant_config_needs_its_layout():
    with pytest.raises(ValueError, match="batch_invariant needs"):
        EngineConfig(model_path="m.gguf", n_threads=1, slots=4, n_ctx_seq=64, n_batch=64, batch_invariant=True)
    EngineConfig(model_path="m.gguf", n_threads=1, slots=4, n_ctx_seq=64, n_batch=64, kv_unified=False,
                 flash_attn=False, repack=False,
                 batch_invariant=True)


def test_the_coordinator_does_not_import_numpy_for_these_rules():
    # runner/job.py plans KV streams with them; numpy would add half a second to its start-up
    # and to every spawned worker's re-import of the main module.
    import subprocess
    import sys

    code = "import sys, ggbatch.runner.job, ggbatch.runner.cli; print('numpy' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_a_scored_prompts_rows_come_from_one_chunk_wherever_its_chunks_start():
    """A chunk that would end among the scored rows ends where they begin (both keeping MIN_ROWS),
    so that a shared prefix, which moves where the chunks start, leaves their product alone."""
    assert invariant.scored_chunk(10, 10, 18, 28, 16) == 8  # [10, 20) would split the rows 18..27
    assert invariant.scored_chunk(0, 16, 18, 28, 16) == 16  # [0, 16) ends before them
    assert invariant.scored_chunk(14, 8, 18, 28, 16) == 8  # 4 rows before them: too few for a chunk alone
    assert invariant.scored_chunk(0, 16, 10, 40, 16) == 16  # 30 scored rows fit no chunk: chunked as any


@pytest.mark.model
@pytest.mark.timeout(120)
def test_scored_continuations_are_the_same_with_a_shared_prefix_and_without(stories):
    """Batch-invariant scoring: the log-likelihoods of continuations longer than MIN_ROWS are the
    same bit for bit whether a shared prefix is computed apart or not, at one slot or four."""
    from ggbatch.workers.protocol import GenerationParams
    from helpers import engine_run

    rng = random.Random(2)
    context = [1] + [rng.randrange(3, 500) for _ in range(18)]
    continuations = tuple(array("i", [rng.randrange(3, 500) for _ in range(9)]) for _ in range(2))
    question = Question("s", array("i", context), 0, continuations=continuations)
    scores = []
    for prefix in (array("i"), array("i", context[:10])):
        for slots in (1, 4):
            config = EngineConfig(model_path=stories, n_threads=1, slots=slots, n_ctx_seq=64, n_batch=16,
                                  prefix_tokens=prefix, generation=GenerationParams(max_tokens=4), kv_unified=False,
                                  flash_attn=False, repack=False, batch_invariant=True)
            scores.append([s.token_logprobs for s in engine_run(config, [question])["s"].scored])
    assert all(s == scores[0] for s in scores), scores
