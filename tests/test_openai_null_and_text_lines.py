"""OpenAI Batch lines as files dumped from the SDK hold them, and the settings a line states
explicitly: a null field is one not given; a line's own plain-text response_format,
`logprobs: false` on /v1/completions, and the messages that name where a refused setting comes from."""

import json

import pytest

from ggbatch.runner.files.formats.openai_request import parse_request
from ggbatch.runner.files.formats.own_settings import own_generation
from ggbatch.workers.protocol import AnswerSpec, GenerationParams, SamplingParams
from helpers import ggbatch, write_jsonl

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def chat(**body):
    return {"custom_id": "q", "method": "POST", "url": CHAT,
            "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **body}}


def completion(**body):
    return {"custom_id": "c", "method": "POST", "url": COMPLETIONS, "body": {"prompt": "Once", "max_tokens": 4,
                                                                           **body}}


@pytest.mark.parametrize("request_line", [
    chat(tools=None, tool_choice=None, user=None, parallel_tool_calls=None, stream=None, audio=None),
    completion(suffix=None, echo=None, best_of=None, user=None, logprobs=None),
    chat(messages=[{"role": "user", "content": "Hi", "name": None},
                   {"role": "assistant", "content": "Hello", "refusal": None, "tool_calls": None,
                    "function_call": None, "audio": None},
                   {"role": "user", "content": "Bye"}]),
])
def test_a_null_field_is_one_not_given(request_line):
    req = parse_request(request_line)
    assert req.error is None, req.error
    assert req.settings.max_tokens == 4 and req.settings.token_logprobs is None


def test_a_field_given_a_value_it_cannot_have_is_still_refused():
    assert parse_request(chat(tools=[])).error.startswith("body.tools: not supported on /v1/chat/completions")
    assert parse_request(completion(suffix="x")).error.startswith("body.suffix: not supported on /v1/completions")
    msg = chat(messages=[{"role": "assistant", "content": "x", "tool_calls": []}])
    assert parse_request(msg).error.startswith("body.messages[0].tool_calls: not supported")


@pytest.mark.parametrize("answer", [AnswerSpec(choices=("A", "B")), AnswerSpec(grammar='root ::= "x"')])
def test_a_lines_plain_text_response_format_replaces_the_jobs_answer(answer):
    job = GenerationParams(8, (), False, SamplingParams(), answer=answer)
    own = own_generation(job, parse_request(chat(response_format={"type": "text"})).settings, ())
    assert own is not None and own.answer is None and own.response_format is None
    plain = GenerationParams(8, (), False, SamplingParams())  # no answer.* to replace: the job's settings
    assert own_generation(plain, parse_request(chat(max_tokens=8, response_format={"type": "text"})).settings,
                          ()) is None


@pytest.mark.timeout(300)
@pytest.mark.model
@pytest.mark.parametrize("job", [["--choices", "A,B"], ["--json-schema", "schema.json"]])
def test_a_text_line_is_answered_freely_under_the_jobs_choices_or_schema(tmp_path, demo_model, job):
    (tmp_path / "schema.json").write_text('{"type":"object","properties":{"k":{"type":"boolean"}},"required":["k"]}')
    job = [str(tmp_path / a) if a.endswith(".json") else a for a in job]
    write_jsonl(tmp_path / "in.jsonl", [{**chat(max_tokens=12, response_format={"type": "text"}), "custom_id": "text"},
                                        {**chat(max_tokens=12), "custom_id": "job"}])
    r = ggbatch("run", "--model", demo_model, "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o.jsonl",
                *job, "-q", timeout=240)
    assert r.returncode == 0, r.stderr
    out = {d["custom_id"]: d["response"]["body"] for d in map(json.loads, open(tmp_path / "o.jsonl"))}
    # the job's line is held to its shape and stops there; the text line runs to its max_tokens
    assert out["job"]["choices"][0]["message"]["content"] in ("A", '{"k" :true }')
    assert out["text"]["usage"]["completion_tokens"] == 12
    assert out["text"]["choices"][0]["message"]["content"] != out["job"]["choices"][0]["message"]["content"]


def test_logprobs_false_on_a_completion_line_gives_none_whatever_the_job_says():
    from ggbatch.runner.files.formats.own_settings import NO_LOGPROBS

    req = parse_request(completion(logprobs=False))
    assert req.error is None and req.settings.token_logprobs == NO_LOGPROBS
    job = GenerationParams(8, (), False, SamplingParams(), token_logprobs=2)
    assert own_generation(job, req.settings, ()).token_logprobs is None
    assert parse_request(completion(logprobs=3)).settings.token_logprobs == 3
    assert parse_request(completion(logprobs=True)).error.startswith("body.logprobs: must be an integer")


@pytest.mark.timeout(300)
@pytest.mark.model
def test_a_completion_line_turns_off_the_jobs_token_logprobs(tmp_path, demo_model):
    write_jsonl(tmp_path / "in.jsonl", [{**completion(logprobs=False), "custom_id": "off"},
                                        {**completion(), "custom_id": "job"}])
    r = ggbatch("run", "--model", demo_model, "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o.jsonl",
                "--token-logprobs", "2", "-q", timeout=240)
    assert r.returncode == 0, r.stderr
    out = {d["custom_id"]: d["response"]["body"] for d in map(json.loads, open(tmp_path / "o.jsonl"))}
    assert out["off"]["choices"][0]["logprobs"] is None
    assert len(out["job"]["choices"][0]["logprobs"]["tokens"]) == out["job"]["usage"]["completion_tokens"]


def test_a_cut_completion_sample_says_it_has_no_answer():
    from openai.types import Completion

    from ggbatch.runner.files.outputs import OutputSpec, Row, render
    from ggbatch.workers.protocol import Answer, FinishReason, Sample

    why = "max_tokens (12) ran out before the answer was complete"
    samples = (Sample('{"k": true}', FinishReason.STOP, 5), Sample("", FinishReason.LENGTH, 12, error=why),
               Sample("", FinishReason.STOP, 0))  # a real empty answer: no error key
    answer = Answer(qid="c", text='{"k": true}', finish_reason=FinishReason.STOP, prompt_tokens=4, completion_tokens=17,
                    samples=samples)
    line = json.loads(render([Row("c", answer)], OutputSpec("openai", completions=frozenset({"c"}))))
    body = Completion.model_validate(line["response"]["body"])
    assert [c.text for c in body.choices] == ['{"k": true}', "", ""]
    assert [(c.model_extra or {}).get("error") for c in body.choices] == [None, why, None]
    assert body.choices[1].finish_reason == "length"
    from ggbatch.runner.scoring.files import openai_text

    assert openai_text(line) == ['{"k": true}', None, ""]  # score: the cut sample is no vote, "" is one


def test_a_greedy_line_under_the_jobs_n_names_the_jobs_n():
    from ggbatch.runner.files.formats.own_settings import samples_problem

    job = GenerationParams(8, (), False, SamplingParams(temperature=1.0, n=2))
    why = samples_problem(parse_request(chat(temperature=0)).settings, job)
    assert why == ("sampling.n (--n 2) of the job: 2 samples need a temperature > 0 (body.temperature is 0), "
                   'else they are 2 identical answers: give this line "n": 1, or a temperature > 0')
    assert samples_problem(parse_request(chat(temperature=0, n=1)).settings, job) is None
    assert samples_problem(parse_request(chat(temperature=0, n=3)).settings, job).startswith("body.n: 3 samples")


def test_half_a_surrogate_pair_is_refused_naming_the_field_and_its_character():
    """JSON's escape "\\ud800" in a message: refused with the line (400), where it is in the line,
    not at a character of the prompt the chat template makes of it."""
    lone = chat(messages=[{"role": "system", "content": "ok"}, {"role": "user", "content": "x \ud800 y"}])
    assert parse_request(lone).error == ("body.messages[1].content: U+D800 at character 3 is half of a surrogate "
                                         "pair: must be text UTF-8 can write")
    texts = [{"type": "text", "text": "a"}, {"type": "text", "text": "\udc80"}]
    parts = chat(messages=[{"role": "user", "content": texts}])
    assert parse_request(parts).error.startswith("body.messages[0].content[1].text: U+DC80 at character 1")
    assert parse_request(completion(prompt="x\ud800")).error.startswith("body.prompt: U+D800 at character 2")
