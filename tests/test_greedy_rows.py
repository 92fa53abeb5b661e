"""The greedy argmax over many logits rows, split among the worker's cores
(workers/llama/sampling.py row_argmax): the same tokens as one numpy pass, ties included."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import gsm8k_records
from ggbatch.runner.questions.prompts import PromptBuilder
from ggbatch.workers.llama.sampling import Sampling, row_argmax
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
from helpers import engine_run


@pytest.mark.parametrize("rows", [list(range(0, 41)), list(range(7, 48)), [9, 2, 30, 2, 44, 0, 17] * 5])
def test_rows_split_among_threads_pick_what_one_pass_picks(rows):
    logits = np.random.default_rng(1).random((50, 1000), dtype=np.float32)
    logits[:, 500] = logits[:, 900] = 2.0  # every row ties at 500 and 900: the lower id wins
    logits[[3, 20, 33], 100] = 3.0
    with ThreadPoolExecutor(3) as pool:
        split = row_argmax(logits, rows, pool, threads=3, floats_per_thread=4000)
    assert split.tolist() == logits[rows].argmax(axis=1).tolist() == row_argmax(logits, rows).tolist()
    assert set(split.tolist()) == ({500, 100} if 3 in rows or 20 in rows else {500})


@pytest.mark.model
@pytest.mark.timeout(120)
def test_an_engine_splitting_every_greedy_step_answers_the_same(stories, monkeypatch):
    from ggbatch.workers.llama.model_runner import Tokenizer

    tok = Tokenizer(stories)
    try:
        b = PromptBuilder(None)
        qs = [Question(f"q{i}", tok.tokenize(b.render(r["question"])), i) for i, r in enumerate(gsm8k_records(12))]
    finally:
        tok.close()
    config = EngineConfig(model_path=stories, n_threads=1, slots=8, n_ctx_seq=512, n_batch=128,
                          generation=GenerationParams(max_tokens=32), kv_unified=False)
    one_pass = {k: a.text for k, a in engine_run(config, qs).items()}
    monkeypatch.setattr(Sampling, "floats_per_thread", 1)  # every step with 2+ greedy rows splits
    assert {k: a.text for k, a in engine_run(config, qs).items()} == one_pass
