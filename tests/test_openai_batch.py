"""OpenAI Batch files without a model: each request line checked (runner/files/formats/openai_request.py),
a whole input file read, the output lines written and read back with the openai package's types."""

import json
import logging
from typing import Any, Optional

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.formats.openai_output import batch_line
from ggbatch.runner.files.formats.openai_request import parse_request
from ggbatch.runner.files.formats.own_settings import QuestionSettings, own_generation, settings_key, vocabulary_problem
from ggbatch.runner.files.inputs import read_question_file
from ggbatch.runner.files.outputs import OutputSpec, Row, render
from ggbatch.workers.protocol import Answer, FinishReason, GenerationParams, ResponseFormat, SamplingParams

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def line(body=None, url=CHAT, **extra):
    return {"custom_id": "q", "method": "POST", "url": url,
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], **(body or {})}, **extra}


def test_a_chat_line_with_every_honoured_field():
    req = parse_request(line({"max_completion_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": -3,
                              "stop": "\n", "logit_bias": {"42": -100, "7": 2.5}, "n": 1, "stream": False,
                              "presence_penalty": 0.5, "frequency_penalty": -1, "logprobs": False,
                              "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "answer", "strict": True,
                                  "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}))
    assert req.error is None and req.endpoint == "chat" and req.model == "gpt-4o-mini"
    assert req.messages == (("user", "hi"),)
    schema = '{"properties":{"n":{"type":"integer"}},"type":"object"}'
    assert req.settings == QuestionSettings(max_tokens=16, temperature=0.7, top_p=0.9, seed=-3, stop=("\n",),
                                            presence_penalty=0.5, frequency_penalty=-1.0,
                                            logit_bias=((7, 2.5), (42, -100.0)),
                                            response_format=ResponseFormat("json_schema", schema, "answer", True),
                                            token_logprobs=-1, n=1)  # logprobs false: none, whatever the job says


def test_fields_about_the_caller_or_the_service_are_taken_and_not_used():
    """A batch file written for OpenAI that says who asks (`user`) or how to keep the request
    (`store`, `metadata`) had every line refused: "body.user: not supported"."""
    unseen = {"user": "u-1", "safety_identifier": "s", "prompt_cache_key": "k", "metadata": {"run": "7"},
              "store": True, "service_tier": "flex", "prompt_cache_retention": "24h",
              "prediction": {"type": "content", "content": "a draft"},  # sooner, the same answer
              # no tool is ever called (a line's tools are refused): these ask for what it gets
              "tool_choice": "none", "parallel_tool_calls": False, "modalities": ["text"]}
    req = parse_request(line(unseen))
    assert req.error is None and req.settings == parse_request(line()).settings
    for key, value in (("tool_choice", "auto"), ("modalities", ["text", "audio"]), ("parallel_tool_calls", 1)):
        assert parse_request(line({key: value})).error.startswith(f"body.{key}: only "), key
    completion = {"custom_id": "c", "url": COMPLETIONS, "body": {"prompt": "a", "user": "u-1"}}
    assert parse_request(completion).error is None
    completion["body"]["store"] = True  # a chat field, as OpenAI's completions refuse it
    assert parse_request(completion).error.startswith("body.store: not supported on /v1/completions")


def test_a_completion_line_and_message_shapes():
    req = parse_request({"custom_id": "c", "url": COMPLETIONS, "body": {"prompt": ["Once"], "max_tokens": 4}})
    assert (req.endpoint, req.prompt, req.settings.max_tokens, req.messages) == ("completion", "Once", 4, ())
    chat = parse_request(line({"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
        {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]}))
    assert chat.messages == (("system", "Be brief."), ("user", "a\nb"), ("assistant", "c"), ("user", "d"))
    assert parse_request(line({"response_format": {"type": "text"}})).settings.response_format == \
        ResponseFormat("text")  # said, not left out: it replaces the job's answer.*
    assert parse_request(line({"response_format": {"type": "json_object"}})).settings.response_format == \
        ResponseFormat("json_object")


@pytest.mark.parametrize("request_line,message", [
    (line({"stream": True}), "body.stream: a batch line cannot stream its answer"),
    (line(url="/v1/embeddings"), "url: '/v1/embeddings' is not answered here"),
    (line({"tools": []}), "body.tools: not supported on /v1/chat/completions (ggbatch honours messages, "),
    ({"custom_id": "c", "url": COMPLETIONS, "body": {"prompt": "a", "max_completion_tokens": 4}},
     "body.max_completion_tokens: not supported on /v1/completions"),
    (line({"temperature": "hot"}), "body.temperature: must be a number, got 'hot'"),
    (line({"temperature": 3}), "body.temperature: must be >= 0 and <= 2, got 3"),
    (line({"top_p": 0}), "body.top_p: must be > 0 and <= 1, got 0"),
    (line({"presence_penalty": 2.5}), "body.presence_penalty: must be >= -2 and <= 2, got 2.5"),
    (line({"frequency_penalty": "high"}), "body.frequency_penalty: must be a number, got 'high'"),
    (line({"max_tokens": 0}), "body.max_tokens: must be from 1 to"),
    (line({"max_tokens": 8, "max_completion_tokens": 9}),
     "body.max_tokens (8) and body.max_completion_tokens (9) differ"),
    (line({"seed": 1.5}), "body.seed: must be an integer"),
    (line({"stop": ["a", "b", "c", "d", "e"]}), "body.stop: must be a non-empty string or a list of up to 4"),
    (line({"stop": [""]}), "body.stop: must be a non-empty string"),
    (line({"logit_bias": {"x": 1}}), "body.logit_bias: token 'x' is not a token id"),
    (line({"logit_bias": {"5": 101}}), "body.logit_bias: token 5: must be >= -100 and <= 100"),
    (line({"response_format": {"type": "xml"}}), "body.response_format: must be {\"type\": \"text\"}"),
    (line({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
     "body.response_format: json_schema: needs a name"),
    (line({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": []}}}),
     "body.response_format: json_schema.schema: must be a JSON Schema object"),
    (line({"n": 0}), "body.n: must be from 1 to 128, got 0"),
    (line({"messages": []}), "body.messages: must be a non-empty list"),
    (line({"messages": [{"role": "tool", "content": "x"}]}), "body.messages[0].role: must be one of"),
    (line({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
     "body.messages[0].content[0]: only text parts are supported, got 'image_url'"),
    (line({"messages": [{"role": "assistant", "content": None, "tool_calls": []}]}),
     "body.messages[0].tool_calls: not supported"),
    (line({"prompt": ["a", "b"]}, url=COMPLETIONS), "body.messages: not supported on /v1/completions"),
    ({"custom_id": "c", "url": COMPLETIONS, "body": {"prompt": ["a", "b"]}},
     "body.prompt: must be one non-empty string"),
    (line(method="GET"), "method: must be POST, got 'GET'"),
    (line(extra_key=1), "extra_key: not a key of a batch request line"),
    ({"custom_id": "q", "url": CHAT, "body": "hi"}, "body: must be a JSON object"),
    (line({"model": 5}), "body.model: must be a string"),
])
def test_a_line_that_cannot_be_answered_as_asked_says_why(request_line, message):
    req = parse_request(request_line)
    assert req.error is not None and req.error.startswith(message), req.error


def batch_file(tmp_path, lines):
    path = tmp_path / "batch.jsonl"
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return str(path)


def test_a_batch_file_keeps_order_and_refused_lines(tmp_path, caplog):
    lines = [{**line(), "custom_id": f"r{i}"} for i in range(3)]
    lines[1]["body"]["stream"] = True
    lines[2]["body"]["model"] = "other"
    with caplog.at_level(logging.INFO, logger="ggbatch"):
        qf = read_question_file(batch_file(tmp_path, lines))
    assert qf.format == "openai" and [(r.qid, r.line) for r in qf.records] == [("r0", 1), ("r1", 2), ("r2", 3)]
    assert [r.request.error is None for r in qf.records] == [True, False, True]
    notes = [r.message for r in caplog.records if "ignored" in r.message]
    assert len(notes) == 1 and "'gpt-4o-mini' (1 line), 'other' (1 line)" in notes[0]


@pytest.mark.parametrize("lines,message", [
    ([{**line(), "custom_id": "a"}, {**line(), "custom_id": "b"}, {**line(), "custom_id": "a"}],
     "batch.jsonl: duplicate custom_id: 'a' (lines 1 and 3)"),
    ([line(), {**line(), "custom_id": 7}], "batch.jsonl:2: a batch request needs a custom_id string, got 7"),
    ([line(), '{"custom_id": "x", '], "batch.jsonl:2: malformed JSON"),
    ([line(), '["x"]'], "batch.jsonl:2: each line of an OpenAI Batch file must be a JSON object"),
])
def test_a_batch_file_that_is_not_one_names_the_lines(tmp_path, lines, message):
    with pytest.raises(InputError) as err:
        read_question_file(batch_file(tmp_path, lines))
    assert message in str(err.value)


def test_openai_as_the_job_says_refuses_an_array(tmp_path):
    path = tmp_path / "batch.json"
    path.write_text(json.dumps([line()]))
    with pytest.raises(InputError, match="batch.json:1: an OpenAI Batch file holds one request per line"):
        read_question_file(str(path), fmt="openai")


def test_own_generation_lays_the_line_over_the_job():
    job = GenerationParams(64, ("\nQuestion:",), False, SamplingParams(temperature=0.0, seed=1))
    assert own_generation(job, QuestionSettings(), job.stop) is None  # nothing of its own
    assert own_generation(job, QuestionSettings(max_tokens=64, temperature=0.0), job.stop) is None
    own = own_generation(job, QuestionSettings(max_tokens=8, temperature=0.5, seed=9, stop=("x",)), job.stop)
    assert (own.max_tokens, own.stop, own.sampling.temperature, own.sampling.seed, own.sampling.top_k) == \
        (8, ("x",), 0.5, 9, 40)
    penalised = own_generation(job, QuestionSettings(presence_penalty=0.5, frequency_penalty=-1.0), job.stop)
    assert (penalised.sampling.presence_penalty, penalised.sampling.frequency_penalty) == (0.5, -1.0)
    # no penalty (the default) is left out of the journal's hash: journals from before penalties stay valid
    assert b"presence_penalty" not in settings_key(job) and b'"presence_penalty": 0.5' in settings_key(penalised)
    assert own_generation(job, QuestionSettings(), ()).stop == ()  # a raw completion prompt: no template stop
    assert vocabulary_problem(QuestionSettings(logit_bias=((31999, 1.0),)), 32000) is None
    assert "token 32000 is not in the model's vocabulary (ids 0-31999)" in \
        vocabulary_problem(QuestionSettings(logit_bias=((32000, 1.0),)), 32000)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status_code: int
    request_id: str
    body: dict[str, Any]


class _Error(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str
    message: str


class BatchRequestOutput(BaseModel):
    """"The per-line object of the batch output and error files", as the OpenAI API reference
    defines it (the openai package has no type for it)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    custom_id: str
    response: Optional[_Response]
    error: Optional[_Error]


def parse_output(text):
    """Every line through the API reference's envelope, every 200 body through the openai types."""
    out = {}
    for raw in text.splitlines():
        env = BatchRequestOutput.model_validate_json(raw)
        body = env.response.body if env.response and env.response.status_code == 200 else None
        if body is not None:
            body = (Completion if body["object"] == "text_completion" else ChatCompletion).model_validate(body)
        out[env.custom_id] = (env, body)
    return out


def test_output_lines_read_by_the_openai_types():
    done = Answer(qid="chat", text="<think>sum</think>\n 4 ", finish_reason=FinishReason.STOP, prompt_tokens=20,
                  completion_tokens=3, created=1_700_000_000.5)
    cut = Answer(qid="comp", text=" there was", finish_reason=FinishReason.LENGTH, prompt_tokens=5, completion_tokens=8,
                 created=1_700_000_001.25)
    rows = [Row("chat", done), Row("comp", cut), Row("bad", None, "body.stream: no"),
            Row("tok", Answer(qid="tok", text="", finish_reason=FinishReason.ERROR, prompt_tokens=0,
                              completion_tokens=0, worker_id=-1, ttft_s=0, latency_s=0, error="no token for U+2019"),
                "no token for U+2019"),
            Row("late", None, "not answered: stopped")]
    spec = OutputSpec("openai", keep_thinking=True, model_name="stories", completions=frozenset({"comp"}),
                      refused=frozenset({"bad"}), started=1_699_999_999.0)
    parsed = parse_output(render(rows, spec))
    assert list(parsed) == ["chat", "comp", "bad", "tok", "late"]
    env, chat = parsed["chat"]
    assert (chat.choices[0].message.content, chat.choices[0].finish_reason, chat.model, chat.created) == \
        ("4", "stop", "stories", 1_700_000_000)
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens) == (20, 3, 23)
    assert chat.choices[0].message.model_extra == {"reasoning_content": "sum"}
    _, comp = parsed["comp"]
    assert (comp.object, comp.choices[0].text, comp.choices[0].finish_reason) == ("text_completion", " there was",
                                                                                  "length")
    bad, _ = parsed["bad"]
    assert bad.response.status_code == 400 and bad.response.body["error"]["message"] == "body.stream: no"
    assert (bad.error.code, parsed["tok"][0].error.code, parsed["late"][0].error.code) == \
        ("invalid_request", "failed", "not_answered")
    assert parsed["tok"][0].response is None and parsed["late"][0].error.message == "not answered: stopped"
    ids = [env.id for env, _ in parsed.values()]
    ids += [env.response.request_id for env, _ in parsed.values() if env.response]
    assert len(set(ids)) == len(ids) and all(i.startswith(("batch_req_", "req_")) for i in ids)


def test_output_ids_are_stable_for_the_same_answer_and_differ_for_another():
    a = Answer(qid="q", text="x", finish_reason=FinishReason.STOP, prompt_tokens=1, completion_tokens=1, worker_id=0,
               ttft_s=0, latency_s=0, created=5.0)
    spec = OutputSpec("openai", started=1.0)
    assert batch_line(Row("q", a), spec) == batch_line(Row("q", a), OutputSpec("openai", started=2.0))
    assert batch_line(Row("q", a), spec)["id"] != batch_line(Row("q2", a), spec)["id"]
    assert batch_line(Row("q", None, "no"), spec)["id"] != batch_line(Row("q", None, "no"), OutputSpec(
        "openai", started=2.0))["id"]


def test_the_layout_guess_before_tokenizing_counts_a_lines_own_text_and_max_tokens(tmp_path):
    from ggbatch.runner.config.schema import build_config
    from ggbatch.runner.plan.tuned import largest_max_tokens, longest_prompt_chars

    records = read_question_file(batch_file(tmp_path, [
        {**line({"max_tokens": 900}), "custom_id": "a"},
        {**line({"messages": [{"role": "user", "content": "x" * 50}]}), "custom_id": "b"}])).records
    config = build_config([("t", {"model": "m", "input": "i", "output": "o", "max_tokens": 100, "system": "abc"})])
    assert largest_max_tokens(records, config) == 900
    assert largest_max_tokens(records[1:], config) == 100  # the job's, for a line without its own
    assert longest_prompt_chars(records, config) == 3 + 50


def test_a_choices_answer_carries_its_choice_logprobs_and_acc_norm_pick():
    from dataclasses import replace

    scored = replace(Answer(qid="mc", text="B", finish_reason=FinishReason.STOP, prompt_tokens=12,
                            completion_tokens=1), answer_norm="C",
                     choice_logprobs={"B": -0.5, "C": -0.9})
    plain = Answer(qid="gen", text="4", finish_reason=FinishReason.STOP, prompt_tokens=12, completion_tokens=1)
    parsed = parse_output(render([Row("mc", scored), Row("gen", plain)], OutputSpec("openai", model_name="m")))
    extra = parsed["mc"][1].choices[0].model_extra
    assert parsed["mc"][1].choices[0].message.content == "B"
    assert extra == {"answer_norm": "C", "choice_logprobs": {"B": -0.5, "C": -0.9}}
    assert parsed["gen"][1].choices[0].model_extra == {}
