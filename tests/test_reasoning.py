"""Reasoning models: a thinking budget (reasoning.max_tokens, --thinking-budget, an OpenAI line's
reasoning_effort) ends the thinking block after N tokens with the model's own end (`</think>`, or
gpt-oss harmony's switch to the final channel), then the model answers; the thinking is kept apart
from the answer; fixed choices and grammars hold the answer after the thinking, not the thinking.

The models are the demo model's shape with a reasoning vocabulary (`ggbatch make-model --reasoning
think|harmony`): their templates open the thinking block, and a random-weight model never writes a
special token itself, so every forced end is the budget's."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from ggbatch.runner.config.reasoning import (
    EFFORT_BUDGETS,
    HARMONY_FORCED,
    effort_problem,
    scoring_context,
    scoring_problem,
    thinking_room,
    with_budget,
    with_effort,
)
from ggbatch.runner.files.formats.openai_request import parse_request
from ggbatch.runner.files.formats.rows import split_thinking
from ggbatch.workers.engine.thinking import ThinkState, Where, opened, overlap
from ggbatch.workers.protocol import GenerationParams, Thinking
from helpers import answers_of, chat_questions, ggbatch, write_jsonl

THINK = Thinking(start=(100,), end=(101,), forced=(101,), blank=(7,))
# harmony: start <|channel|> analysis <|message|>, end <|channel|> final <|message|>,
# forced <|end|> <|start|> assistant <|channel|> final <|message|>
HARMONY = Thinking(start=(1, 2, 3), end=(1, 4, 3), forced=(5, 6, 9, 1, 4, 3), header=True)


# -- the thinking block, pure ---------------------------------------------------------------------


def run(state: ThinkState, model_tokens: list[int], n: int) -> list[int]:
    """n tokens as the engine writes them: the forced one when there is one, else the model's."""
    out, chosen = [], iter(model_tokens)
    for _ in range(n):
        token = state.next_forced()
        token = next(chosen) if token is None else token
        state.see(token)
        out.append(token)
    return out


def test_a_budget_ends_a_block_the_prompt_opened_after_exactly_n_tokens():
    state = ThinkState(with_budget(THINK, 3, "x"), [9, 100, 7])  # `<think>\n`: whitespace after the opening
    assert state.where is Where.THINKING
    assert run(state, [50, 51, 52, 53, 54], 6) == [50, 51, 52, 101, 53, 54]
    assert state.answering and state.count == 3


def test_the_models_own_end_ends_it_before_the_budget_and_no_budget_never_forces():
    state = ThinkState(with_budget(THINK, 5, "x"), [100])
    assert run(state, [50, 101, 60], 3) == [50, 101, 60] and state.answering
    free = ThinkState(THINK, [100])
    assert run(free, list(range(200, 300)), 100) == list(range(200, 300)) and not free.answering


def test_budget_zero_ends_at_once_and_a_model_that_does_not_open_it_answers_from_its_first_token():
    assert run(ThinkState(with_budget(THINK, 0, "x"), [100]), [50], 2) == [101, 50]
    state = ThinkState(with_budget(THINK, 2, "x"), [9])
    assert state.where is Where.OPENING and not state.answers_with(100)  # it opens the block itself
    state.see(100)
    assert run(state, [50, 51, 52], 4) == [50, 51, 101, 52]
    direct = ThinkState(with_budget(THINK, 2, "x"), [9])
    assert direct.answers_with(42) and direct.answering  # its first token is the answer's


def test_harmony_waits_for_a_channel_and_completes_a_switch_the_model_began():
    state = ThinkState(with_budget(HARMONY, 4, "x"), [8])
    assert not state.answers_with(1)  # the header says which channel: nothing is answered yet
    assert run(state, [1, 2, 3, 60, 61, 5, 6], 9) == [1, 2, 3, 60, 61, 5, 6, 9, 1]
    assert state.pending == [4, 3]  # its own <|end|><|start|> counted, the rest written for it
    run(state, [], 2)
    assert state.answering
    final = ThinkState(with_budget(HARMONY, 4, "x"), [8])
    run(final, [1, 4, 3], 3)
    assert final.answering and final.count == 0  # straight to the final channel


def test_openings_and_overlaps():
    assert opened([1, 100, 7, 7], (100,), (7,)) and not opened([100, 5], (100,), (7,)) and not opened([], (100,), ())
    assert overlap([0, 5, 6], (5, 6, 9)) == 2 and overlap([0, 5], (6,)) == 0


# -- the answers file: thinking kept apart -----------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("<|channel|>analysis<|message|>add<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>", ("add", "4")),
    ("add them<|end|><|start|>assistant<|channel|>final<|message|>4", ("add them", "4")),  # opened by the prompt
    ("x<|end|><|start|> assistant<|channel|> final<|message|> 4", ("x", " 4")),  # a SentencePiece vocabulary's
    ("<|channel|>final<|message|>4", (None, "4")),
    ("<|channel|>analysis<|message|>cut short", ("cut short", "")),  # no answer: max_tokens ran out thinking
    ("cut short<|end|><|start|> assistant<|channel|> fin", ("cut short", "")),  # ... or in the switch
])
def test_harmony_final_channel_is_the_answer_and_analysis_the_thinking(text, expected):
    assert split_thinking(text) == expected


# -- settings: the budget, reasoning_effort ------------------------------------------------------------


def test_reasoning_effort_is_a_budget_and_is_refused_where_nothing_thinks():
    line = {"custom_id": "a", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}}
    assert parse_request(line).settings.reasoning_effort == "low"
    bad = parse_request({**line, "body": {**line["body"], "reasoning_effort": "max"}})
    assert bad.error == "body.reasoning_effort: must be one of none, minimal, low, medium, high, got 'max'"
    job = GenerationParams(thinking=THINK)
    own = with_effort(None, job, "low")
    assert own is not None and own.thinking is not None and own.thinking.budget == EFFORT_BUDGETS["low"]
    assert with_effort(None, job, None) is None
    assert effort_problem("low", job) is None
    assert "no thinking block" in (effort_problem("low", GenerationParams()) or "")
    with pytest.raises(ValueError, match=r"^reasoning.max_tokens: 4: the model's vocabulary has no thinking block"):
        with_budget(None, 4, "reasoning.max_tokens")
    assert thinking_room(with_budget(THINK, 10, "x"), 256) == 12 and thinking_room(THINK, 256) == 256


def test_a_scored_choice_follows_the_block_the_prompt_opened_closed_empty():
    assert scoring_context("<|im_start|>assistant\n<think>\n", THINK) == "<|im_start|>assistant\n<think>\n</think>"
    assert scoring_context("<|im_start|>assistant\n", THINK) == "<|im_start|>assistant\n"  # not opened
    closed = "<think>\n\n</think>\n\n"  # a template asked for no thinking closed it itself
    assert scoring_context(closed, THINK) == closed and scoring_context("Q: A:", None) == "Q: A:"
    assert scoring_context("<|start|>assistant", HARMONY) == "<|start|>assistant<|channel|>final<|message|>"
    analysis = "<|start|>assistant<|channel|>analysis<|message|>"
    assert scoring_context(analysis, HARMONY) == analysis + HARMONY_FORCED
    assert scoring_problem(with_budget(THINK, 0, "x")) is None and scoring_problem(THINK) is None
    assert (scoring_problem(with_budget(THINK, 4, "x")) or "").startswith(
        "reasoning.max_tokens: 4 with answer.choice_scoring: loglikelihood:")
    assert effort_problem("none", GenerationParams(thinking=THINK), scored=True) is None
    assert "only 'none' applies" in (effort_problem("low", GenerationParams(thinking=THINK), scored=True) or "")


# -- real llama.cpp -------------------------------------------------------------------------------


TEXTS = ["What is two and two?", "Tell me a story about a dog.", "Why is the sky blue?",
         "Name three animals.", "How many legs has a cat?", "Say hello."]


def _engine_texts(model: str, budget: int, max_tokens: int, slots: int, **config) -> tuple[dict, list]:
    """qid -> Answer from a LlamaEngine with a thinking budget, and the questions."""
    from ggbatch.workers.llama.engine import LlamaEngine
    from ggbatch.workers.llama.model_runner import Tokenizer
    from ggbatch.workers.protocol import EngineConfig

    tok = Tokenizer(model)
    try:
        questions = chat_questions(tok, TEXTS)
        think = Thinking(tuple(tok.tokenize("<think>", False)), *[tuple(tok.tokenize("</think>", False))] * 2,
                         budget=budget, blank=tuple(tok.tokenize("\n", False)))
    finally:
        tok.close()
    gen = GenerationParams(max_tokens=max_tokens, thinking=think)
    engine = LlamaEngine(EngineConfig(model_path=model, n_threads=1, slots=slots, n_ctx_seq=256, n_batch=256,
                                      generation=gen, **config), worker_id=0)
    try:
        return answers_of(engine, questions), questions
    finally:
        engine.close()


@pytest.mark.model
@pytest.mark.timeout(180)
def test_exactly_n_thinking_tokens_then_the_end_then_the_models_answer(think_model):
    """Each answer is the prompt's N greedy tokens, `</think>`, then the greedy continuation of
    all that, as llama.cpp alone decodes it."""
    from llama_cpp import Llama

    from ggbatch.workers.llama.model_runner import Tokenizer

    n, max_tokens = 5, 12
    answers, questions = _engine_texts(think_model, n, max_tokens, slots=3)
    tok = Tokenizer(think_model)
    llm = Llama(model_path=think_model, n_ctx=512, flash_attn=True, verbose=False)
    try:
        end = list(tok.tokenize("</think>", False))
        for q in questions:
            thought = list(islice(llm.generate(list(q.tokens), temp=0.0, reset=True), n))
            after = list(islice(llm.generate(list(q.tokens) + thought + end, temp=0.0, reset=True),
                                max_tokens - n - 1))
            expected = b"".join(tok._vocab.piece(t) for t in thought) + b"</think>" + \
                b"".join(tok._vocab.piece(t) for t in after)
            got = answers[q.qid]
            assert (got.text, got.completion_tokens) == (expected.decode("utf-8", "replace"), max_tokens), q.qid
            thinking, answer = split_thinking(got.text)
            assert thinking and answer.strip() and thinking not in answer
    finally:
        llm.close()
        tok.close()


@pytest.mark.model
@pytest.mark.timeout(180)
def test_the_forced_end_is_the_same_at_one_slot_and_at_many_batch_invariant(think_model):
    invariant = {"kv_unified": False, "flash_attn": False, "repack": False, "batch_invariant": True}
    one, _ = _engine_texts(think_model, 4, 14, slots=1, **invariant)
    many, _ = _engine_texts(think_model, 4, 14, slots=6, **invariant)
    assert {q: a.text for q, a in one.items()} == {q: a.text for q, a in many.items()}
    assert all(a.text.count("</think>") == 1 for a in one.values())


def _questions(tmp_path: Path, n: int = len(TEXTS)) -> Path:
    return write_jsonl(tmp_path / "q.jsonl", [{"questionID": f"q{i}", "question": t} for i, t in enumerate(TEXTS[:n])])


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_writes_the_answer_without_the_thinking_and_a_resume_keeps_it(think_model, tmp_path):
    out = tmp_path / "a.jsonl"

    def run_job(n: int, budget: int = 4):
        return ggbatch("run", "--model", think_model, "--output", out, "--thinking-budget", budget, "--max-tokens",
                       12, "--keep-thinking", "-q", "--input", _questions(tmp_path, n))

    first = run_job(3)
    assert first.returncode == 0, first.stderr
    rows = _read(out)
    assert all(r["thinking"] and r["answer"] and "</think>" not in r["answer"] for r in rows)
    grown = run_job(len(TEXTS))  # resumed: three answers from the journal
    assert grown.returncode == 0, grown.stderr
    assert _read(out)[:3] == rows and len(_read(out)) == len(TEXTS)
    other = run_job(len(TEXTS), budget=6)
    assert other.returncode == 2 and "reasoning" in other.stderr  # another budget: other answers


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_openai_output_carries_reasoning_content_and_reasoning_effort_sets_the_budget(think_model, tmp_path):
    lines = [{"custom_id": effort, "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": "Say hello."}], "reasoning_effort": effort,
                       "max_tokens": 10}} for effort in ("none", "minimal")]
    out = tmp_path / "out.jsonl"
    done = ggbatch("run", "--model", think_model, "--input", write_jsonl(tmp_path / "in.jsonl", lines),
                   "--output", out, "-q")
    assert done.returncode == 0, done.stderr
    message = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"] for r in _read(out)}
    assert message["none"]["reasoning_content"] == "" and message["none"]["content"]  # budget 0: at once
    # minimal's budget (128) is past max_tokens: all of it thinking, no end written, no answer
    assert message["minimal"]["content"] == "" and message["minimal"]["reasoning_content"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_choices_and_schemas_hold_the_answer_after_the_thinking(think_model, tmp_path):
    questions = _questions(tmp_path, 3)
    out = tmp_path / "c.jsonl"
    done = ggbatch("run", "--model", think_model, "--input", questions, "--output", out, "--thinking-budget", 3,
                   "--choices", "A,B,C", "--choice-logprobs", "--keep-thinking", "-q")
    assert done.returncode == 0, done.stderr
    for row in _read(out):
        assert row["answer"] in ("A", "B", "C") and row["thinking"] and set(row["choice_logprobs"]) == {"A", "B", "C"}
    out = tmp_path / "j.jsonl"
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    done = ggbatch("run", "--model", think_model, "--input", questions, "--output", out, "--thinking-budget", 3,
                   "--json-schema", schema, "--max-tokens", 40, "--keep-thinking", "-q")
    assert done.returncode == 0, done.stderr
    for row in _read(out):
        assert isinstance(json.loads(row["answer"])["n"], int) and row["thinking"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_harmony_budget_switches_to_the_final_channel(harmony_model, tmp_path):
    out = tmp_path / "h.jsonl"
    done = ggbatch("run", "--model", harmony_model, "--input", _questions(tmp_path, 2), "--output", out,
                   "--thinking-budget", 4, "--max-tokens", 30, "--keep-thinking", "-q")
    assert done.returncode == 0, done.stderr
    for row in _read(out):
        assert row["thinking"] and row["answer"] and "<|" not in row["answer"] + row["thinking"]


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_budget_for_a_model_that_does_not_think_is_one_line_exit_2(demo_model, tmp_path):
    done = ggbatch("run", "--model", demo_model, "--input", _questions(tmp_path, 1), "--output", tmp_path / "o.jsonl",
                   "--thinking-budget", 8, "-q")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ggbatch: error: reasoning.max_tokens: 8: the model's vocabulary has no thinking block (<think> and "
        "</think>, or gpt-oss's harmony channels), so there is no thinking to bound"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_choices_scored_by_loglikelihood_are_scored_after_the_closed_block(think_model, tmp_path):
    """The template opens the block (`<think>\n`): each choice is scored as the answer after
    `</think>`, as llama-cpp-python scores it there, not as the first words of the thinking."""
    from ggbatch.runner.questions.continuations import continuation_text, pair_texts
    from ggbatch.runner.questions.prompts import PromptBuilder
    from ggbatch.workers.llama.model_runner import Tokenizer
    from test_loglik import TOLERANCE, reference

    choices = ["alpha", "beta gamma", "delta"]
    rows = [{"questionID": f"m{i}", "question": text, "choices": choices} for i, text in enumerate(TEXTS[:2])]
    questions = write_jsonl(tmp_path / "mc.jsonl", rows)
    scores = {}
    for budget in ((), ("--thinking-budget", 0)):
        out = tmp_path / f"ll{len(budget)}.jsonl"
        done = ggbatch("run", "--model", think_model, "--input", questions, "--output", out, "--choices", "auto",
                       "--choice-scoring", "loglikelihood", "--choice-logprobs", *budget, "-q")
        assert done.returncode == 0, done.stderr
        scores[len(budget)] = {row["questionID"]: row["choice_logprobs"] for row in _read(out)}
    assert scores[0] == scores[2]  # no budget: the same empty block as a budget of 0

    tok = Tokenizer(think_model)
    builder = PromptBuilder(tok.chat_template, bos_token=tok.bos_text, eos_token=tok.eos_text)
    for i, text in enumerate(TEXTS[:2]):
        prompt = builder.render(text)
        assert prompt.endswith("<think>\n")
        for context_text, moved in ((prompt + "</think>", False), (prompt, True)):
            pairs = []
            for choice in choices:
                context, whole = pair_texts(context_text, continuation_text(choice))
                context_tokens = list(tok.tokenize(context, add_bos=builder.needs_bos(context)))
                whole_tokens = list(tok.tokenize(whole, add_bos=builder.needs_bos(context)))
                pairs.append((context_tokens, whole_tokens[len(context_tokens):]))
            want = [sum(lps) for lps, _ in reference(think_model, pairs)]
            got = [scores[0][f"m{i}"][choice] for choice in choices]
            differences = [abs(g - w) for g, w in zip(got, want)]
            if moved:  # inside the thinking the scores are others: the test tells the two apart
                assert max(differences) > 0.5
            else:
                assert max(differences) < TOLERANCE, (got, want)


@pytest.mark.model
@pytest.mark.timeout(180)
def test_keep_thinking_with_scored_choices_is_said_once_per_pool(think_model, caplog):
    import logging

    import ggbatch

    logger = logging.getLogger("ggbatch")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="ggbatch"):
            with ggbatch.Pool(model=think_model, workers=1, keep_thinking=True,
                              answer={"choices": ["yes", "no"], "choice_scoring": "loglikelihood"}) as pool:
                for choices in (["yes", "no"], ["red", "blue"], ["up", "down"]):  # a new variant each
                    (got,) = pool.answer(["Which one?"], choices=choices)
                    assert got.text in choices
    finally:
        logger.removeHandler(caplog.handler)
    said = {id(r) for r in caplog.records if "no answer has thinking to keep" in r.getMessage()}
    assert len(said) == 1  # (each record is caught by both handlers: counted once by its identity)
