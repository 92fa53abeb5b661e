"""OpenAI's presence and frequency penalties (sampling.presence_penalty, frequency_penalty, and an
OpenAI Batch line's own): llama.cpp's penalties sampler over the answer's tokens so far, on the
real engine. The demo model's random weights make every logit close to the others, so a penalty
of 2 nats decides each pick: greedy with presence_penalty 2 never writes a token twice."""

import collections
import json

import pytest

import ggbatch
from helpers import ggbatch as run_ggbatch

pytestmark = [pytest.mark.timeout(180), pytest.mark.model]

QUESTIONS = ["Once upon a time", "Tell me a story", "Why is the sky blue?"]


def most_repeated(tokens: list[str]) -> int:
    return max(collections.Counter(tokens).values())


def tokens_of(demo_model: str, **sampling: float) -> list[list[str]]:
    answers = ggbatch.answer(QUESTIONS, model=demo_model, max_tokens=32, sampling=sampling,
                             answer={"token_logprobs": 0}, prompt={"template": "{{question}}"})
    return [[entry["token"] for entry in a.token_logprobs] for a in answers]


def test_a_presence_penalty_keeps_a_greedy_answer_from_repeating_a_token(demo_model):
    plain = tokens_of(demo_model)
    assert max(map(most_repeated, plain)) > 1  # greedy on random weights falls into loops
    assert [most_repeated(t) for t in tokens_of(demo_model, presence_penalty=2.0)] == [1, 1, 1]
    assert [most_repeated(t) for t in tokens_of(demo_model, frequency_penalty=2.0)] == [1, 1, 1]
    encouraged = tokens_of(demo_model, presence_penalty=-2.0)  # a negative penalty favours what was written
    assert all(most_repeated(e) >= most_repeated(p) for e, p in zip(encouraged, plain)), (encouraged, plain)


def test_an_openai_line_takes_its_own_penalty(demo_model, tmp_path):
    """`presence_penalty: 0.5` on a batch line was refused ("only 0 is supported")."""
    def line(custom_id: str, **body: float) -> str:
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                           "body": {"model": "m", "prompt": QUESTIONS[0], "max_tokens": 32, "logprobs": 0, **body}})

    questions = tmp_path / "batch.jsonl"
    questions.write_text("\n".join([line("plain"), line("penalised", presence_penalty=2)]) + "\n")
    out = tmp_path / "out.jsonl"
    done = run_ggbatch("run", "--model", demo_model, "--input", questions, "--output", out, "-q")
    assert done.returncode == 0, done.stderr
    tokens = {row["custom_id"]: row["response"]["body"]["choices"][0]["logprobs"]["tokens"]
              for row in map(json.loads, out.read_text().splitlines())}
    assert most_repeated(tokens["plain"]) > 1 and most_repeated(tokens["penalised"]) == 1, tokens
