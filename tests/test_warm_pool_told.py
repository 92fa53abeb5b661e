"""A warm pool's call told of its answers as they come (Pool.submit_questions' on_answered): what
ggbatch.lm_eval's progress bar and lm-eval's cache are fed from, before the call's Future resolves."""

import pytest

import ggbatch
from ggbatch.runner.warm.calls import Answered
from ggbatch.workers.protocol import Question


@pytest.mark.timeout(120)
def test_a_call_hears_of_each_question_answered_before_its_future_resolves(demo_model):
    with ggbatch.Pool(model=demo_model, max_tokens=24, ignore_eos=True, slots=2, workers=1) as pool:
        prompts = pool.tokenize([f"Question {i}: once upon a time" for i in range(6)])
        questions = [Question(f"q{i}", p, i) for i, p in enumerate(prompts)]
        heard: list[list[Answered]] = []
        call = pool.submit_questions(questions, heard.append)
        told_by_then: list[int] = []
        call.add_done_callback(lambda _: told_by_then.append(sum(map(len, heard))))
        answers = call.result(timeout=60)

        def broken(rows: list[Answered]) -> None:
            raise ValueError("a caller's progress bar")

        again = pool.submit_questions(questions[:2], broken).result(timeout=60)
    assert [a.text for a in again] == [a.text for a in answers[:2]]  # the pool's loop went on
    told = {row.id: row for batch in heard for row in batch}
    assert sorted(told) == [f"q{i}" for i in range(6)] and len(told) == sum(map(len, heard))
    assert [told[a.id].text for a in answers] == [a.text for a in answers]  # each told with its answer
    assert told_by_then == [6]  # every answer told before the call's Future resolved
    assert len(heard) > 1  # two slots: told as they come back, not once at the end
    assert [a.id for a in answers] == [f"q{i}" for i in range(6)] and all(a.text for a in answers)
