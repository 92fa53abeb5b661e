"""ggbatch.Pool's calls across real processes: answers as ggbatch.answer gives them, per-call
settings, many threads at once, a worker or tokenizer killed during a call (its life: started,
closed, left open: test_warm_pool_lifetime.py). The real engine on the demo model, the fake
engine where the model does not matter. Every test has a hard timeout: a hang is a failure."""

import os
import pickle
import threading
import time
from array import array
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

import ggbatch
from fake_engine import Fake
from ggbatch.workers.protocol import GenerationParams, Question
from helpers import children

pytestmark = pytest.mark.model


@pytest.mark.timeout(120)
def test_a_warm_pool_answers_calls_as_answer_does_and_leaves_no_process(demo_model):
    before = children()
    with ggbatch.Pool(model=demo_model, max_tokens=8) as pool:
        assert children() - before  # its workers and tokenizer
        first = pool.answer(["Once upon a time", "The little dog"])
        computed = pool.stats()["prompt_tokens_computed"]
        again = pool.answer(["Once upon a time"])
        # the prompt again: its slot still holds it, only its last token is computed anew
        assert pool.stats()["prompt_tokens_computed"] - computed == 1 < computed
        one = pool.submit("The little dog").result(timeout=60)
    assert children() <= before
    assert [a.id for a in first] == ["0", "1"] and all(a.text and a.error is None for a in first)
    assert again[0].text == first[0].text and one.text == first[1].text
    assert [a.text for a in ggbatch.answer(["Once upon a time"], model=demo_model, max_tokens=8)] == [first[0].text]


@pytest.mark.timeout(120)
def test_stats_count_the_answers_callers_got_failures_apart(demo_model):
    """stats()["answered"] counted prompts finished, failures included: a duplicate question
    counted once, a prompt too long for the context as answered."""
    with ggbatch.Pool(model=demo_model, max_tokens=4, workers=1, model__n_ctx=64) as pool:
        first = pool.answer(["Once upon a time", "The little dog", "Once upon a time"])
        after_first = pool.stats()
        second = pool.answer([" ".join(["the little dog ran home"] * 40), "A cat"])
        after_second = pool.stats()
        time.sleep(1.0)
        idle = pool.stats()
    assert [a.error is None for a in first] == [True, True, True]
    assert [a.error is None for a in second] == [False, True]
    assert (after_first["answered"], after_first["failed"]) == (3, 0)
    assert (after_second["answered"], after_second["failed"]) == (4, 1)
    # a rate of the time answering: the pool's idle second leaves it as it was (it fell by a third)
    assert idle["generated_tokens_per_s"] == after_second["generated_tokens_per_s"] > 0
    assert idle["answering_s"] == after_second["answering_s"] < idle["elapsed_s"] - 1.0


@pytest.mark.timeout(120)
def test_the_pools_age_counts_from_pool_its_workers_load_included(demo_model):
    """elapsed_s counted from the watch's start, after the workers, the tokenizer and the layout:
    a pool said it was younger than its own worker's load."""
    before = time.perf_counter()
    with ggbatch.Pool(model=demo_model, max_tokens=4, workers=1) as pool:
        stats = pool.stats()
        age = time.perf_counter() - before
    load = stats["workers"][0]["load_s"]
    # stats round to the millisecond: an age of 0.33298 s reads 0.333
    assert load is not None and load <= stats["elapsed_s"] <= age + 0.0005
    # what Pool() took before the workers were asked to start is small: all but it is counted
    assert stats["elapsed_s"] >= age - 0.25, (stats["elapsed_s"], age)


@pytest.mark.timeout(120)
def test_overrides_change_one_call_only(demo_model):
    with ggbatch.Pool(model=demo_model, max_tokens=8) as pool:
        short = pool.answer(["Once upon a time"], max_tokens=2)
        chosen = pool.answer(["Once upon a time"], choices=["yes", "no"])
        plain = pool.answer(["Once upon a time"])
        with pytest.raises(ggbatch.GgbatchError, match=r"workers= cannot change per call"):
            pool.answer(["Hi"], workers=3)
        for name in ("temperature", "sampling__temperature"):  # Pool()'s spelling, or none: said how
            with pytest.raises(ggbatch.GgbatchError) as err:
                pool.answer(["Hi"], **{name: 0.5})
            assert str(err.value) == (f"ggbatch.Pool.answer(): {name}= is a sampling setting: a call gives it as "
                                      "sampling={'temperature': ...}")
        warm = pool.answer(["Once upon a time"], sampling={"temperature": 0.9, "seed": 1})
    assert plain[0].text.startswith(short[0].text) and len(short[0].text) < len(plain[0].text)
    assert chosen[0].text in ("yes", "no") and warm[0].error is None


@pytest.mark.timeout(120)
def test_a_bad_call_is_said_of_the_method_called(demo_model):
    """pool.submit(5) said `ggbatch.Pool.answer(): questions[0] ...`, a method the caller never called."""
    with ggbatch.Pool(model=demo_model, max_tokens=4, workers=1) as pool:
        either = "must be a string, a record (a mapping) or a conversation (a list of messages)"
        calls = [(lambda: pool.submit(5), f"ggbatch.Pool.submit(): question {either}, got int"),
                 (lambda: pool.submit(["a", "b"]), f"ggbatch.Pool.submit(): question {either}, got list (submit "
                                                   "takes one question; submit_many and answer take a list)"),
                 (lambda: pool.submit({"text": "Hi"}), "ggbatch.Pool.submit(): question: "),
                 (lambda: pool.submit("Hi", max_tokenz=3), "ggbatch.Pool.submit(): "),
                 (lambda: pool.submit_many(["Hi", 5]), "ggbatch.Pool.submit_many(): questions[1] must be a string"),
                 (lambda: pool.answer(["Hi", 5]), "ggbatch.Pool.answer(): questions[1] must be a string"),
                 # an error between two of the call's keys, not of one: it named no method
                 (lambda: pool.answer(["Hi"], sampling={"n": 3, "temperature": 0.7}, choices=["yes", "no"]),
                  "ggbatch.Pool.answer(): sampling.n: 3 samples of answer.choices answered from the logits"),
                 (lambda: pool.submit("Hi", sampling={"temperature": -1}), "ggbatch.Pool.submit(): sampling.")]
        for call, said in calls:
            with pytest.raises(ggbatch.GgbatchError) as err:
                call()
            assert str(err.value).startswith(said), str(err.value)
        assert pool.submit("Hi").result(timeout=60).text is not None  # the pool still answers


@pytest.mark.timeout(120)
def test_settings_checked_as_they_are_used_are_said_of_the_call_and_its_keyword(demo_model):
    """A schema, grammar or template refused as it was used named the job key alone
    (`answer.json_schema: ...`), neither the call nor its keyword; pickling a pool named a lock,
    tokenize took a string as its characters and a number as an AttributeError, and a record
    without an id, numbered by its index, was blamed as a duplicate of the id another one gave."""
    for settings, said in [({"answer": {"json_schema": {"type": "nonsense"}}}, "ggbatch.Pool(): answer.json_schema: "),
                           ({"prompt": {"template": "{{ nope"}}, "ggbatch.Pool(): prompt.template: line 1: ")]:
        with pytest.raises(ggbatch.GgbatchError) as err:
            ggbatch.Pool(model=demo_model, workers=1, **settings)
        assert str(err.value).startswith(said), str(err.value)
    with ggbatch.Pool(model=demo_model, max_tokens=4, workers=1) as pool:
        calls = [(lambda: pool.answer(["Hi"], schema={"type": "nonsense"}), "ggbatch.Pool.answer(): schema: cannot"),
                 (lambda: pool.submit("Hi", grammar="root ::= ("), "ggbatch.Pool.submit(): grammar: not a grammar"),
                 (lambda: pool.tokenize(["Hi", 5]), "ggbatch.Pool.tokenize(): texts[1] must be a string, got int"),
                 (lambda: pool.answer([{"questionID": "1", "question": "x"}, {"question": "y"}]),
                  "ggbatch.Pool.answer(): questions[1] has no questionID, so its index, '1', is its id, which "
                  "questions[0] gives as its own")]
        for call, said in calls:
            with pytest.raises(ggbatch.GgbatchError) as err:
                call()
            assert str(err.value).startswith(said), str(err.value)
        with pytest.raises(TypeError, match=r"^ggbatch.Pool\(\): a pool cannot be pickled"):
            pickle.dumps(pool)
        assert pool.tokenize("Hi there") == pool.tokenize(["Hi there"])  # one string, one text


@pytest.mark.timeout(120)
def test_a_calls_refused_keywords_are_said_as_given(demo_model):
    """A call's keyword refused by the job key's own check named the job key (`answer.grammar:
    must be GBNF text`, `answer.json_schema and answer.grammar: give one of them`), and
    tokenize(None) or tokenize(b"abc") was a bare TypeError or "texts[0] must be a string, got int"."""
    with ggbatch.Pool(model=demo_model, max_tokens=2, workers=1) as pool:
        calls = [(lambda: pool.answer(["a"], grammar=5), "ggbatch.Pool.answer(): grammar: must be GBNF text"),
                 (lambda: pool.answer(["a"], schema={"type": "string"}, grammar='root ::= "a"'),
                  "ggbatch.Pool.answer(): schema= and grammar=: give one of them"),
                 (lambda: pool.submit("a", choices="yes"), "ggbatch.Pool.submit(): choices: must be two or more"),
                 (lambda: pool.tokenize(None), "ggbatch.Pool.tokenize(): texts must be a string or a list of "
                                               "strings, got NoneType"),
                 (lambda: pool.tokenize(b"abc"), "ggbatch.Pool.tokenize(): texts must be a string or a list of "
                                                 "strings, got bytes")]
        for call, said in calls:
            with pytest.raises(ggbatch.GgbatchError) as err:
                call()
            assert str(err.value).startswith(said), str(err.value)


@pytest.mark.timeout(120)
def test_samples_and_token_logprobs_come_back_as_python_objects(demo_model):
    settings = dict(model=demo_model, max_tokens=6, sampling={"temperature": 0.8, "n": 3},
                    answer={"token_logprobs": 2})
    with ggbatch.Pool(**settings) as pool:
        (warm,) = pool.answer(["Once upon a time"])
    (cold,) = ggbatch.answer(["Once upon a time"], **settings)
    for a in (warm, cold):
        assert a.samples is not None and len(a.samples) == 3 and a.text == a.samples[0].text
        assert len({s.text for s in a.samples}) > 1  # seeds differ by sample
        for s in a.samples:
            assert s.token_logprobs and all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in s.token_logprobs)
    assert [s.text for s in warm.samples] == [s.text for s in cold.samples]  # a pool answers as answer() does


@pytest.mark.timeout(120)
def test_hand_made_tokens_outside_the_vocabulary_are_refused_by_name(demo_model):
    with ggbatch.Pool(model=demo_model, max_tokens=4) as pool:
        (context,) = pool.tokenize(["Once upon a time"])
        good = Question("good", context, 0, continuations=(array("i", [5]),))
        biased = GenerationParams(max_tokens=2, logit_bias=((3, 1.0), (10**6, 5.0)))
        for bad, part in ((Question("q7", context, 0, continuations=(array("i", [5]), array("i", [-1]))),
                           "continuation 1 has token -1"),
                          (Question("q8", array("i", [*context, 10**7]), 0), "prompt has token 10000000"),
                          (Question("q9", context, 0, biased), "logit_bias has token 1000000")):
            with pytest.raises(ggbatch.GgbatchError, match=rf"question '{bad.qid}': its {part}, which is not in"):
                pool.submit_questions([good, bad])
        (scored,) = pool.submit_questions([good]).result(timeout=60)
        answered = pool.stats()["answered"]
    assert scored.id == "good" and scored.error is None and scored.scored is not None
    assert answered == 1  # nothing of the refused calls was sent


@pytest.mark.timeout(120)
def test_32_threads_submitting_at_once_share_the_batches(demo_model):
    with ggbatch.Pool(model=demo_model, max_tokens=64, ignore_eos=True, slots=32, workers=1) as pool:
        barrier = threading.Barrier(32)

        def ask(i):
            barrier.wait()
            return pool.submit(f"Question {i}: once upon a time").result(timeout=60)

        with ThreadPoolExecutor(32) as ex:
            answers = list(ex.map(ask, range(32)))
        stats = pool.stats()
    assert all(a.text is not None for a in answers) and stats["answered"] == 32
    assert stats["generated_tokens"] == 32 * 64
    # Decoded one after another, 32 questions of 64 tokens take 2,048 steps; together about 64, plus
    # the steps the threads' submissions spread over on a loaded machine (a step of this model is
    # far shorter than a thread's wait for a core: 64 tokens each leave room for that spread).
    assert stats["steps"] < 4 * 64, stats
    # where the worker's time went: its load, then the engine's steps, llama_decode the most of them
    times = stats["workers"][0]
    assert 0 < times["load_s"] < 60 and 0 < times["engine_decode_s"] <= times["engine_step_s"], times
    assert 0 < times["engine_sample_s"] < times["engine_step_s"], times


@pytest.mark.timeout(120)
def test_a_worker_killed_during_a_call_is_restarted_and_the_call_answered(demo_model, tmp_path):
    fake = Fake(slow=0.05, exit_after=3, marker=str(tmp_path / "died"))
    with ggbatch.Pool(model=demo_model, workers=1, slots=2, engine_factory=fake) as pool:
        answers = pool.answer([f"q{i}" for i in range(12)])
        stats = pool.stats()
    assert (tmp_path / "died").exists()
    assert all(a.text and a.error is None for a in answers)
    assert stats["workers"][0]["restarts"] == 1


@pytest.mark.timeout(120)
def test_questions_cancelled_before_a_worker_had_them_are_not_answered(demo_model):
    """fut.cancel() returned True, and the worker spent its tokens on the question all the same."""
    with ggbatch.Pool(model=demo_model, workers=1, slots=1, engine_factory=Fake(slow=0.5)) as pool:
        futures = [pool.submit(f"q{i}") for i in range(8)]  # the worker holds 2: a batch, and its refill
        many = pool.submit_many(["a", "b"])
        cancelled = [f.cancel() for f in futures[3:] + [many]]
        kept = [f.result(timeout=60) for f in futures[:3]]
        last = pool.submit("last").result(timeout=60)  # after the cancelled ones: they were not waited for
    stats = pool.stats()
    assert cancelled == [True] * 6 and all(a.text and a.error is None for a in kept + [last])
    # the fake engine's 3 tokens an answer, and 1 step each (1 slot): 4 questions answered, no more
    assert (stats["generated_tokens"], stats["steps"], stats["answered"]) == (3 * 4, 4, 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("overrides", [{}, {"choices": ["dog", "cat"]}])
def test_a_tokenizer_process_killed_from_outside_is_started_again(demo_model, overrides):
    """The kernel's out-of-memory killer may pick the tokenizer process: the pool's next call
    starts a new one and is answered, as a killed worker's questions are. A call with choices
    not seen before checks them through the tokenizer first: it raised WorkerFailure, each time."""
    with ggbatch.Pool(model=demo_model, max_tokens=4) as pool:
        first = pool.answer(["Once upon a time"], **overrides)[0].text
        overrides = {"choices": ["dog", "bird"]} if overrides else {}  # choices whose check is not cached

        def tokenizers() -> list[psutil.Process]:
            return [p for p in psutil.Process().children() if p.name().startswith("ggbatch-tokeni")]

        (tokenizer,) = tokenizers()
        tokenizer.kill()
        tokenizer.wait(timeout=10)
        again = pool.answer(["Once upon a time"], **overrides)[0]
        assert again.error is None and (again.text == first if not overrides else again.text in ("dog", "bird"))
        assert len(pool.tokenize(["The little dog"])[0]) > 1
        assert [p.pid for p in tokenizers()] != [tokenizer.pid]


@pytest.mark.timeout(120)
def test_a_worker_started_again_after_the_folder_changed_loads_the_same_model(demo_model, tmp_path, monkeypatch):
    """A pool made with a relative model path, in a pipeline that then changes folder: the worker
    started again after a kill looked for the model in the new folder and never answered."""
    monkeypatch.chdir(os.path.dirname(demo_model))
    with ggbatch.Pool(model=os.path.basename(demo_model), workers=1, max_tokens=4) as pool:
        first = pool.answer(["Once upon a time"])[0].text
        os.chdir(tmp_path)
        (worker,) = [p for p in psutil.Process().children() if not p.name().startswith("ggbatch-tokeni")
                     and "resource_tracker" not in " ".join(p.cmdline())]
        worker.kill()
        worker.wait(timeout=10)
        again = pool.answer(["Once upon a time"])[0]
        stats = pool.stats()
    assert again.error is None and again.text == first
    assert stats["workers"][0]["restarts"] == 1


@pytest.mark.timeout(120)
def test_a_question_that_kills_workers_fails_alone(demo_model):
    fake = Fake(segv_on="0/3")
    with ggbatch.Pool(model=demo_model, workers=1, slots=4, engine_factory=fake) as pool:
        answers = pool.answer([f"q{i}" for i in range(8)])
        after = pool.answer(["still here"])
    assert answers[3].text is None and "a worker died 2 times" in answers[3].error
    assert all(a.text for i, a in enumerate(answers) if i != 3)
    assert after[0].text


@pytest.mark.timeout(120)
def test_a_call_on_an_idle_pool_is_taken_at_once_not_at_the_next_tick(demo_model):
    import time

    from ggbatch.runner.pool.pool import TICK_S

    # The pool's loop waits on its calls' wake pipe (runner/warm/intake.py); a call it were not
    # woken for would wait for the loop's next tick, up to TICK_S.
    with ggbatch.Pool(model=demo_model, max_tokens=1, workers=1) as pool:
        pool.answer(["warm up"])
        took = []
        for i in range(5):
            time.sleep(0.3)  # the loop is waiting again
            t0 = time.perf_counter()
            pool.answer([f"q{i}"])
            took.append(time.perf_counter() - t0)
    assert max(took) < TICK_S / 2, took


SCORED = {"choices": "auto", "choice_scoring": "loglikelihood", "logprobs": True}
CHOICE_RECORDS = [{"questionID": "q1", "question": "The dog was", "choices": {"A": "big", "B": "red", "C": "happy"}},
                  {"questionID": "q2", "question": "Once upon a time", "choices": ["there was", "a girl"]}]


@pytest.mark.timeout(120)
def test_a_warm_pool_scores_each_records_own_choices_as_answer_does(demo_model):
    """answer.choices auto failed in Pool()'s constructor: `-:0: record 'a' has no 'choices'`,
    of a record the caller never gave (the probes its plan is made from)."""
    cold = ggbatch.answer(CHOICE_RECORDS, model=demo_model, workers=1, answer=SCORED)
    # lm-eval's acc_norm pick, as `ggbatch run` writes it beside the answer (it was dropped)
    assert all(a.answer_norm in a.choice_logprobs for a in cold), cold
    with ggbatch.Pool(model=demo_model, workers=1, answer=SCORED) as pool:
        warm = pool.answer(CHOICE_RECORDS)
        # a record without its own is named as the caller gave it, not by a line of no file (`-:2:`)
        with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.Pool.answer\(\): questions\[1\]: record '1' has "
                           r"no 'choices' mapping or list \(answer.choices: auto\)$"):
            pool.answer([CHOICE_RECORDS[0], {"questionID": "1", "question": "Who was there?"}])
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.answer\(\): questions\[0\]: record '0' has no"):
        ggbatch.answer(["Who was there?"], model=demo_model, workers=1, answer=SCORED)
    assert [a.text for a in warm] == [a.text for a in cold]
    assert warm[0].text in ("A", "B", "C") and warm[1].text in ("there was", "a girl")
    assert [set(a.choice_logprobs) for a in warm] == [{"A", "B", "C"}, {"there was", "a girl"}]
    assert [a.answer_norm for a in warm] == [a.answer_norm for a in cold]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("template", ["Q: {{ question }} ({{ subject }})", '{{ record["Prompt Text"] }}'])
def test_a_pool_whose_template_reads_other_fields_starts_and_names_a_record_without_them(demo_model, template):
    """The pool's probes (what its plan is made from) had a question field alone: a template
    reading another field failed the constructor, `questions[-1]: record 'a' has no field 'subject'`."""
    record = {"questionID": "a", "question": "x", "subject": "math", "Prompt Text": "Once upon"}
    with ggbatch.Pool(model=demo_model, workers=1, max_tokens=4, prompt={"template": template}) as pool:
        (answered,) = pool.answer([record])
        assert answered.text and answered.error is None
        with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.Pool.answer\(\): questions\[1\]: record 'b' has no "
                           r"field '(subject|Prompt Text)' that prompt.template uses"):
            pool.answer([record, {"questionID": "b", "question": "y"}])


@pytest.mark.timeout(240)
def test_calls_making_new_choices_beside_other_calls_leave_every_answer_as_alone(demo_model):
    """A call's new choices are checked through the tokenizer process; that took a lock of its
    own while other calls' prompts were tokenized under the pool's: the two threads' requests
    interleaved on the one pipe (EOFError, a stalled tokenizer). One lock now."""
    plain = [f"Once upon a time number {i} there was" for i in range(200)]
    with ggbatch.Pool(model=demo_model, workers=1, max_tokens=2) as pool:
        alone = [a.text for a in pool.answer(plain)]

        def plain_calls() -> list[list]:
            return [[a.text for a in pool.answer(plain)] for _ in range(3)]

        def choice_calls(k: int) -> list:
            return [pool.answer(["Pick one"], choices=[f"word{k}x{j}a", f"word{k}x{j}b"], max_tokens=16)[0].text
                    for j in range(15)]

        with ThreadPoolExecutor(5) as ex:
            plains = [ex.submit(plain_calls) for _ in range(2)]
            chosen = [ex.submit(choice_calls, k) for k in range(3)]
            assert all(texts == alone for f in plains for texts in f.result(timeout=200))
            for k, f in enumerate(chosen):
                assert all(text in (f"word{k}x{j}a", f"word{k}x{j}b") for j, text in enumerate(f.result(timeout=200)))
