"""Token log-probabilities worked out during the next decode (workers/llama/later_logprobs.py):
where llama.cpp's threads leave the worker's cores free, a step's entries are computed beside the
next llama_decode. The answers and their entries must be those computed before it, whichever
step a sequence finishes at."""

from __future__ import annotations

from array import array

import pytest

from ggbatch.workers.protocol import Answer, EngineConfig, GenerationParams, Question, SamplingParams
from helpers import answers_of


def questions() -> list[Question]:
    """Greedy and sampled questions that finish at different steps (their own max_tokens), one of
    two samples, one that asks for no log-probabilities: while some finish, others go on."""
    out = []
    for i in range(6):
        sampling = SamplingParams(temperature=0.9, top_k=20) if i % 2 else SamplingParams()
        out.append(Question(f"q{i}", array("i", [1, 20 + i, 40 + 3 * i, 7]), 5 + i,
                            GenerationParams(max_tokens=3 + 2 * i, ignore_eos=True, token_logprobs=i % 4,
                                             sampling=sampling)))
    out.append(Question("two", array("i", [1, 33, 8]), 3,
                        GenerationParams(max_tokens=9, ignore_eos=True, token_logprobs=2,
                                         sampling=SamplingParams(temperature=0.8, n=2))))
    out.append(Question("none", array("i", [1, 34, 9]), 4, GenerationParams(max_tokens=7, ignore_eos=True)))
    return out


def run(model: str, host_threads: int, monkeypatch) -> tuple[dict[str, Answer], dict[str, float]]:
    """The answers of an engine with one llama.cpp thread and `host_threads` for the host's work."""
    from ggbatch.workers.llama import sampling as host
    from ggbatch.workers.llama.engine import LlamaEngine

    monkeypatch.setattr(host.Sampling, "host_threads", host_threads)
    monkeypatch.setattr(host.Sampling, "floats_per_thread", 1)  # the demo model's rows spread too
    engine = LlamaEngine(EngineConfig(model_path=model, n_threads=1, slots=8, n_ctx_seq=64, n_batch=64,
                                      generation=GenerationParams()), worker_id=0)
    try:
        return answers_of(engine, questions()), engine.stats()
    finally:
        engine.close()


@pytest.mark.model
@pytest.mark.timeout(180)
@pytest.mark.parametrize("host_threads", [2, 3])
def test_entries_worked_out_during_the_next_decode_are_those_worked_out_before_it(demo_model, host_threads,
                                                                                  monkeypatch):
    before, plain = run(demo_model, 1, monkeypatch)  # no core left beside llama.cpp's thread
    later, stats = run(demo_model, host_threads, monkeypatch)
    assert plain["logprob_later_tokens"] == 0
    # Every step's entries but those of the sequences finishing at it were worked out later
    assert 0 < stats["logprob_later_tokens"] < stats["logprob_tokens"] == plain["logprob_tokens"]
    assert sorted(later) == sorted(before)
    for qid, answer in before.items():
        assert later[qid].text == answer.text and later[qid].error is None, qid
        assert later[qid].token_logprobs == answer.token_logprobs, qid
        assert later[qid].samples == answer.samples, qid
    assert later["none"].token_logprobs is None
    assert [len(a.token_logprobs or ()) for a in (later[f"q{i}"] for i in range(6))] == [3, 5, 7, 9, 11, 13]
    assert all(len(s.token_logprobs or ()) == 9 for s in later["two"].samples or ())
