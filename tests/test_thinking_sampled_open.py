"""A sampled reasoning model whose prompt leaves the block to it: its first token is drawn once.
When that draw is `<think>`, the block is followed (the thinking budget writes `</think>` after
it); when it is anything else, the model answers with that very token. Drawing again for the
answer moved the chain's random generator a second time and could pick `<think>` then: the
block was never followed, the budget never fired, and the thinking landed in the answer.

The model is the demo shape with a `<think>` vocabulary (`ggbatch make-model --reasoning think`),
the prompt plain text that does not open the block, and a logit_bias on `<think>` makes it a
likely first token at temperature 1."""

from __future__ import annotations

from array import array
from typing import Optional

import pytest

from ggbatch.workers.protocol import AnswerSpec, GenerationParams, Question, SamplingParams, Thinking
from helpers import answers_of

BUDGET = 3
N_QUESTIONS = 60
# Any text, `<think>` included: the grammar allows what the model draws, so that a second draw
# for the answer could come out `<think>` under it as without it.
ANY_TEXT = 'root ::= [^\\x00]*'
INVARIANT = {"kv_unified": False, "flash_attn": False, "repack": False, "batch_invariant": True}


def _texts(model: str, slots: int, grammar: Optional[str] = None) -> dict[str, str]:
    """qid -> answer text of N_QUESTIONS seeded questions on one prompt that does not open the
    block, sampled at temperature 1 with `<think>` pushed up by a logit_bias."""
    from ggbatch.workers.llama.engine import LlamaEngine
    from ggbatch.workers.llama.model_runner import Tokenizer
    from ggbatch.workers.protocol import EngineConfig

    tok = Tokenizer(model)
    try:
        start, end = tok.tokenize("<think>", False), tok.tokenize("</think>", False)
        prompt = array("i", tok.tokenize("Hello there", True))
    finally:
        tok.close()
    assert len(start) == len(end) == 1
    gen = GenerationParams(max_tokens=8, thinking=Thinking((start[0],), (end[0],), (end[0],), budget=BUDGET),
                           logit_bias=((start[0], 3.0),), sampling=SamplingParams(temperature=1.0),
                           answer=AnswerSpec(grammar=grammar) if grammar else None)
    engine = LlamaEngine(EngineConfig(model_path=model, n_threads=1, slots=slots, n_ctx_seq=64, n_batch=64,
                                      generation=gen, **INVARIANT), worker_id=0)
    try:
        got = answers_of(engine, [Question(f"q{i}", prompt, i) for i in range(N_QUESTIONS)])
    finally:
        engine.close()
    return {qid: a.text for qid, a in got.items()}


def _check_block_followed(texts: dict[str, str]) -> None:
    """Every answer that opens the block has the forced end in it; some open it, some answer
    straight away (both ways of the first token are taken)."""
    opened = {qid: t for qid, t in texts.items() if t.startswith("<think>")}
    not_followed = {qid: t for qid, t in opened.items() if "</think>" not in t}
    assert not not_followed, f"{len(not_followed)} of {len(texts)} open <think> without the forced end"
    assert 0 < len(opened) < len(texts)


@pytest.mark.model
@pytest.mark.timeout(180)
def test_a_sampled_first_token_that_opens_the_block_is_followed(think_model):
    _check_block_followed(_texts(think_model, slots=8))


@pytest.mark.model
@pytest.mark.timeout(180)
def test_under_a_grammar_the_first_draw_is_the_one_the_grammar_is_asked_about(think_model):
    _check_block_followed(_texts(think_model, slots=8, grammar=ANY_TEXT))


@pytest.mark.model
@pytest.mark.timeout(180)
def test_seeded_answers_are_the_same_at_one_slot_and_at_many(think_model):
    many = _texts(think_model, slots=8)
    assert _texts(think_model, slots=8) == many
    assert _texts(think_model, slots=1) == many
