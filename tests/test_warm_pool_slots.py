"""A warm pool's slots: few while its calls are small (every slot's KV is allocated and cleared as
a worker starts), grown once to the layout's cap when its calls bring more sequences; slots asked
for stay as asked. The real engine on the demo model; every test has a hard timeout."""

import logging
import time
from array import array

import psutil
import pytest

import ggbatch
from ggbatch.runner.plan.layout import MAX_AUTO_SLOTS
from ggbatch.runner.warm.facts import FIRST_WARM_SLOTS, GUESS_PROMPT
from ggbatch.workers.protocol import GenerationParams, Question, SamplingParams

pytestmark = pytest.mark.model


def worker_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if "tokeniz" not in p.name()}


def contexts(pool: ggbatch.Pool) -> list[int]:
    """The engines each worker has built: one at its start, one more at each growth (in place)."""
    return [w["contexts"] for w in pool.stats()["workers"].values()]


@pytest.mark.timeout(180)
def test_a_warm_pool_starts_with_few_slots_and_grows_once_its_calls_bring_more(demo_model):
    with ggbatch.Pool(model=demo_model, max_tokens=4, ignore_eos=True, workers=1) as pool:
        small = pool.answer([f"Once upon a time {i}" for i in range(3)])
        idle, first_life = pool.stats(), worker_pids()
        many = pool.answer([f"The little dog {i}" for i in range(40)])
        grown, second_life = pool.stats(), worker_pids()
        more = pool.answer([f"A big cat {i}" for i in range(40)])
        later = pool.stats()
        assert contexts(pool) == [2]  # grown once: the second big call built nothing again
    assert all(a.text is not None and a.error is None for a in small + many + more)
    assert idle["slots"] == FIRST_WARM_SLOTS < grown["slots"] == later["slots"], (idle, grown)
    # the worker built its larger context in place: the same process, its weights kept (no new load)
    assert first_life == second_life
    (before,), (after,) = idle["workers"].values(), grown["workers"].values()
    assert (before["contexts"], after["contexts"], after["restarts"]) == (1, 2, 0), (before, after)
    # 40 questions of 4 tokens in one wave: a prompt step or two, then 3 decode steps, where
    # 16 slots would have taken three waves of at least 4 steps each
    assert later["steps"] - grown["steps"] < 3 * 4, (grown, later)


@pytest.mark.timeout(180)
def test_a_calls_samples_count_as_sequences_and_grow_the_slots_they_need(demo_model):
    """One question asking for more samples than the pool started with: they decode together, a
    slot each, so the pool grows first rather than failing the question."""
    for workers in (1, 2):  # two workers start with 32 slots, 16 each: 24 samples fit neither
        with ggbatch.Pool(model=demo_model, max_tokens=4, ignore_eos=True, workers=workers) as pool:
            answer = pool.answer(["Once upon a time"], sampling={"n": 24, "temperature": 0.8})[0]
            slots = pool.stats()["slots"]
        assert answer.error is None and len(answer.samples or []) == 24, (workers, answer)
        assert slots >= 24 * workers


@pytest.mark.timeout(180)
def test_the_samples_of_calls_still_open_count_toward_the_load(demo_model):
    """A question of 16 samples fills the first slots; another of 15 while it decodes makes 31
    sequences, more than 16: the pool grows (the open call's samples count, not the question)."""
    with ggbatch.Pool(model=demo_model, max_tokens=1500, ignore_eos=True, workers=1) as pool:
        first = pool.submit("Once upon a time", sampling={"n": FIRST_WARM_SLOTS, "temperature": 0.8})
        while pool.stats()["steps"] < 2 and not first.done():  # the first is decoding
            time.sleep(0.01)
        second = pool.submit("The little dog", sampling={"n": FIRST_WARM_SLOTS - 1, "temperature": 0.8})
        still_open = not first.done()
        answers = [first.result(), second.result()]
        slots = pool.stats()["slots"]
    assert still_open, "the first call ended before the second came: the test shows nothing"
    assert all(a.error is None and len(a.samples or []) == n
               for a, n in zip(answers, (FIRST_WARM_SLOTS, FIRST_WARM_SLOTS - 1))), answers
    assert slots > FIRST_WARM_SLOTS


@pytest.mark.timeout(180)
def test_a_question_wider_than_any_plan_fails_alone_without_a_restart(demo_model):
    """More samples than the auto cap gives a worker: growing would not hold them, so the workers
    keep running (no restart) and the question fails with one line that says to ask for fewer."""
    with ggbatch.Pool(model=demo_model, max_tokens=4, ignore_eos=True, workers=1) as pool:
        before = contexts(pool)
        wide = pool.answer(["Once upon a time"], sampling={"n": MAX_AUTO_SLOTS + 1, "temperature": 0.8})[0]
        too_many = SamplingParams(temperature=0.8, n=MAX_AUTO_SLOTS + 1)
        (tokenized,) = pool.submit_questions([Question("tokenized", pool.tokenize("The cat")[0], 0,
                                                       GenerationParams(4, ignore_eos=True, sampling=too_many))]
                                             ).result(timeout=60)
        fine = pool.answer(["The little dog"])[0]
        assert contexts(pool) == before == [1] and pool.stats()["slots"] == FIRST_WARM_SLOTS
    for refused in (wide, tokenized):  # the cap, not the 16 a worker has before it grows
        assert refused.error is not None and f"holds {MAX_AUTO_SLOTS} at most" in refused.error, refused
    assert fine.error is None, fine


@pytest.mark.timeout(180)
def test_a_pools_own_samples_are_planned_from_the_start_past_the_cap(demo_model):
    """The pool's (or the call's) sampling.n is planned as a job's is: a slot a sample from the
    start, past the auto cap if need be, with no growth's restart."""
    wide = MAX_AUTO_SLOTS + 6
    answer = ggbatch.answer(["Once upon a time"], model=demo_model, max_tokens=4, ignore_eos=True, workers=1,
                            sampling={"n": wide, "temperature": 0.8})[0]
    assert answer.error is None and len(answer.samples or []) == wide, answer
    with ggbatch.Pool(model=demo_model, max_tokens=4, ignore_eos=True, workers=1,
                      sampling={"n": FIRST_WARM_SLOTS + 4, "temperature": 0.8}) as pool:
        before, slots = contexts(pool), pool.stats()["slots"]
        answers = pool.answer(["Once upon a time"])
        assert contexts(pool) == before == [1]
    assert slots >= FIRST_WARM_SLOTS + 4
    assert all(a.error is None and len(a.samples or []) == FIRST_WARM_SLOTS + 4 for a in answers), answers


@pytest.mark.timeout(180)
def test_one_answer_call_with_scored_choices_plans_their_tokens_and_grows_nothing(demo_model):
    """ggbatch.answer plans its context for the prompt and the longest choice scored after it:
    no worker builds a larger context on the call's only poll."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("ggbatch")
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        answers = ggbatch.answer([f"Is {i} even?" for i in range(4)], model=demo_model, workers=1,
                                 answer={"choices": ["yes, it is even", "no, it is odd"],
                                         "choice_scoring": "loglikelihood"})
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert all(a.text in ("yes, it is even", "no, it is odd") for a in answers), answers
    assert not [m for m in said if "grows" in m], said


@pytest.mark.timeout(180)
def test_a_scored_context_past_the_guess_needs_no_room_for_max_tokens(demo_model):
    """A warm pool plans GUESS_PROMPT tokens of prompt and its max_tokens a sequence. A context past
    the guess that is only scored generates nothing: it fits, and no worker builds a larger context."""
    with ggbatch.Pool(model=demo_model, max_tokens=256, workers=1) as pool:
        (context,) = pool.tokenize([" ".join(["Once upon a time there was a dog."] * 43)])
        assert GUESS_PROMPT + 8 < len(context) < GUESS_PROMPT + 200, len(context)
        before = contexts(pool)
        (scored,) = pool.submit_questions([Question("long", context, 0, continuations=(array("i", [5, 6]),))]
                                          ).result(timeout=60)
        assert contexts(pool) == before == [1]
    assert scored.error is None and scored.scored is not None, scored


@pytest.mark.timeout(180)
def test_slots_asked_for_stay_as_asked_whatever_the_calls_bring(demo_model):
    with ggbatch.Pool(model=demo_model, max_tokens=4, ignore_eos=True, workers=1, slots=8) as pool:
        before = contexts(pool)
        answers = pool.answer([f"The little dog {i}" for i in range(40)])
        stats = pool.stats()
        assert contexts(pool) == before == [1]
    assert all(a.text is not None for a in answers) and stats["slots"] == 8


@pytest.mark.timeout(180)
def test_scoring_calls_grow_nothing_and_lm_evals_pool_starts_small(demo_model):
    """Scored questions generate no token: 40 of them leave the pool at its first slots, as
    lm-eval's log-likelihood requests leave its model's pool; start_small=False plans every slot."""
    scoring = {"choices": ["yes", "no"], "choice_scoring": "loglikelihood"}
    with ggbatch.Pool(model=demo_model, workers=1, answer=scoring) as pool:
        before = contexts(pool)
        answers = pool.answer([f"Is {i} even?" for i in range(40)])
        assert pool.stats()["slots"] == FIRST_WARM_SLOTS and contexts(pool) == before == [1]
    assert all(a.text in ("yes", "no") for a in answers)
    with ggbatch.Pool(model=demo_model, max_tokens=4, workers=1, start_small=False) as pool:
        assert pool.stats()["slots"] > FIRST_WARM_SLOTS
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from ggbatch.lm_eval import GgbatchLM

    lm = GgbatchLM(model=demo_model, workers=1, threads=1)
    try:
        assert lm.pool.stats()["slots"] == FIRST_WARM_SLOTS
    finally:
        lm.pool.close()
