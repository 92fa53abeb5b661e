"""OpenAI Batch lines of the Responses API (url /v1/responses): each line's input and settings
checked (runner/files/formats/openai_responses.py), and its answer written as a `response` object
that the openai package's Response type reads, on the real engine."""

import json
from dataclasses import replace

import pytest
from openai.types.responses import Response

from ggbatch.runner.files.formats.openai_request import RESPONSES, parse_request
from ggbatch.runner.files.formats.own_settings import QuestionSettings
from ggbatch.runner.files.outputs import OutputSpec, Row, render
from ggbatch.runner.scoring.files import openai_norm, openai_text
from ggbatch.workers.protocol import Answer, FinishReason, ResponseFormat
from helpers import ggbatch

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def line(custom_id="q", **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
            "body": {"model": "gpt-4.1-mini", "input": "2+2?", **body}}


def test_a_responses_line_with_every_honoured_field():
    req = parse_request(line(
        instructions="Be brief.", max_output_tokens=16, temperature=0.7, top_p=0.9, top_logprobs=3,
        include=["message.output_text.logprobs"], reasoning={"effort": "low", "summary": "auto"},
        text={"format": {"type": "json_schema", "name": "sum", "schema": SCHEMA, "strict": True}},
        input=[{"role": "developer", "content": [{"type": "input_text", "text": "Use digits."}]},
               {"role": "user", "content": "2+2?"},
               {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "4", "annotations": None}]},
               {"role": "user", "content": "And 3+3?"}],
        user="u-1", store=False, metadata={"run": "7"}, background=False, truncation="disabled"))
    assert req.error is None and req.endpoint == RESPONSES
    assert req.messages == (("system", "Be brief."), ("system", "Use digits."), ("user", "2+2?"), ("assistant", "4"),
                            ("user", "And 3+3?"))
    schema = json.dumps(SCHEMA, sort_keys=True, separators=(",", ":"))
    assert req.settings == QuestionSettings(max_tokens=16, temperature=0.7, top_p=0.9, token_logprobs=3,
                                            reasoning_effort="low",
                                            response_format=ResponseFormat("json_schema", schema, "sum", True))
    plain = parse_request(line())
    assert plain.messages == (("user", "2+2?"),) and plain.settings == QuestionSettings()


@pytest.mark.parametrize("body, message", [
    ({"input": []}, "body.input: must be a non-empty string or a non-empty list of messages"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]},
     "body.input[0].type: 'function_call_output' is not answered here (messages only: no tools, files or images)"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "body.input[0].content[0]: only text parts are supported, got 'input_image'"),
    ({"tools": [{"type": "function", "name": "f"}]}, "body.tools: not supported on /v1/responses"),
    ({"n": 2}, "body.n: not supported on /v1/responses"),
    ({"top_logprobs": 2}, 'body.top_logprobs: needs body.include ["message.output_text.logprobs"]'),
    ({"include": ["file_search_call.results"]}, "body.include: 'file_search_call.results' is not given here"),
    ({"text": {"format": {"type": "xml"}}}, "body.text.format: must be {\"type\": \"text\"}"),
    ({"text": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "body.text.format: json_schema: needs a name"),
    ({"reasoning": {"effort": "extreme"}}, "body.reasoning.effort: must be one of none, minimal, low"),
    ({"background": True}, "body.background: only false is supported, got true"),
    ({"truncation": "auto"}, "body.truncation: only disabled is supported, got 'auto'"),
    ({"max_output_tokens": 0}, "body.max_output_tokens: must be from 1 to"),
    ({"instructions": 5}, "body.instructions: must be a string, got 5"),
])
def test_a_line_the_api_answers_otherwise_is_refused_naming_its_field(body, message):
    assert parse_request(line(**body)).error.startswith(message)


def test_an_answer_is_a_response_with_its_thinking_as_a_reasoning_item():
    thought = Answer(qid="t", text="<think>sum</think>\n 4 ", finish_reason=FinishReason.STOP, prompt_tokens=20,
                     completion_tokens=7, created=1_700_000_000.5)
    cut = Answer(qid="c", text="Once upon", finish_reason=FinishReason.LENGTH, prompt_tokens=5, completion_tokens=2)
    spec = OutputSpec("openai", model_name="demo", responses=frozenset({"t", "c"}), started=1.0)
    bodies = {row["custom_id"]: Response.model_validate(row["response"]["body"])
              for row in map(json.loads, render([Row("t", thought), Row("c", cut)], spec).splitlines())}
    thinking, message = bodies["t"].output
    assert (thinking.type, thinking.content[0].text, bodies["t"].output_text, message.status) == \
        ("reasoning", "sum", "4", "completed")
    assert (bodies["t"].usage.input_tokens, bodies["t"].usage.output_tokens, bodies["t"].created_at) == \
        (20, 7, 1_700_000_000)
    assert (bodies["c"].status, bodies["c"].incomplete_details.reason, bodies["c"].output[0].status) == \
        ("incomplete", "max_output_tokens", "incomplete")
    scored = replace(cut, qid="s", text="B", finish_reason=FinishReason.STOP, answer_norm="C",
                     choice_logprobs={"B": -0.5, "C": -0.7})  # choices scored by log-likelihood
    row = json.loads(render([Row("s", scored)], replace(spec, responses=frozenset({"s"}))))
    assert (openai_text(row), openai_norm(row)) == ("B", "C")  # as `ggbatch score` reads them
    assert row["response"]["body"]["output"][0]["content"][0]["choice_logprobs"] == {"B": -0.5, "C": -0.7}


@pytest.mark.model
@pytest.mark.timeout(180)
def test_responses_lines_are_answered_by_the_model_and_resumed_as_responses(demo_model, tmp_path):
    lines = [line("plain", max_output_tokens=6),
             line("weighed", max_output_tokens=4, include=["message.output_text.logprobs"], top_logprobs=2),
             line("json", max_output_tokens=48, text={"format": {"type": "json_schema", "name": "n",
                                                                 "schema": SCHEMA, "strict": True}}),
             line("tool", tools=[{"type": "function", "name": "f"}]),
             line("effort", reasoning={"effort": "low"})]  # the demo model does not think
    questions = tmp_path / "batch.jsonl"
    questions.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    done = ggbatch("run", "--model", demo_model, "--input", questions, "--output", out, "-q")
    assert done.returncode == 1, done.stderr  # one line refused, as OpenAI answers it with a 400
    rows = {row["custom_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    refused = ("tool", "effort")
    bodies = {k: Response.model_validate(r["response"]["body"]) for k, r in rows.items() if k not in refused}
    assert bodies["plain"].usage.output_tokens == 6 and bodies["plain"].status == "incomplete"
    logprobs = bodies["weighed"].output[0].content[0].logprobs
    assert len(logprobs) == 4 and all(len(entry.top_logprobs) == 2 for entry in logprobs)
    assert isinstance(json.loads(bodies["json"].output_text)["n"], int)
    assert rows["tool"]["response"]["status_code"] == 400
    # a check shared with chat lines names the field as this line does, not body.reasoning_effort
    assert rows["effort"]["error"]["message"].startswith("body.reasoning.effort: 'low': the model's vocabulary has no")
    again = ggbatch("run", "--model", demo_model, "--input", questions, "--output", out, "-q")
    assert again.returncode == 1  # the answers from the journal, written as responses again
    assert [row for row in map(json.loads, out.read_text().splitlines()) if row["custom_id"] not in refused] == \
        [rows[k] for k in ("plain", "weighed", "json")]
    refused = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "n.jsonl",
                      "--n", "2", "--temperature", "0.5", "-q")
    assert "a /v1/responses line has one answer (the Responses API has no n)" in (tmp_path / "n.jsonl").read_text()
    assert refused.returncode == 1
