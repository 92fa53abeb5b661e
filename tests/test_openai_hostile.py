"""An OpenAI Batch line of any JSON shape is answered or refused with its reason: a value of the
wrong JSON type anywhere (a list where a string goes, an object where a number goes) never
escapes as a Python exception from the reader."""

import itertools

import pytest

from ggbatch.runner.files.formats.openai_request import COMPLETION, parse_request

VALUES = [None, True, 0, -1, 1.5, "", "x", [], [1], ["a", "b"], {}, {"a": 1}, [{"role": "user"}]]
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETION_BODY = {"model": "m", "prompt": "Once", "max_tokens": 4}
RESPONSES_BODY = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]}
BODY_KEYS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
             "stop", "logit_bias", "response_format", "n", "logprobs", "top_logprobs", "frequency_penalty",
             "presence_penalty", "input", "instructions", "max_output_tokens", "text", "reasoning", "include", "user",
             "background", "truncation"]


def line(url="/v1/chat/completions", **body):
    return {"custom_id": "q1", "method": "POST", "url": url, "body": body}


@pytest.mark.parametrize("key", ["method", "url", "body"])
def test_a_line_key_of_any_json_type_is_refused_or_answered(key):
    for value in VALUES:
        req = parse_request({**line(**CHAT_BODY), key: value})
        assert req.error or req.messages, (key, value)


@pytest.mark.parametrize("url,body", [("/v1/chat/completions", CHAT_BODY), ("/v1/completions", COMPLETION_BODY),
                                      ("/v1/responses", RESPONSES_BODY)])
def test_a_body_field_of_any_json_type_is_refused_or_answered(url, body):
    for key, value in itertools.product(BODY_KEYS, VALUES):
        req = parse_request(line(url, **{**body, key: value}))
        assert req.error is not None or req.prompt is not None or req.messages, (key, value)
        if req.error is None and url == "/v1/completions":
            assert req.endpoint == COMPLETION


def test_a_responses_input_item_or_part_of_any_json_type_is_refused_or_answered():
    for key, value in itertools.product(["role", "content", "type", "id", "status"], VALUES):
        item = {**RESPONSES_BODY["input"][0], key: value}
        req = parse_request(line("/v1/responses", input=[item], text={"format": value}, reasoning={"effort": value}))
        assert req.error is not None or req.messages, (key, value)
    for key, value in itertools.product(["type", "text"], VALUES):
        part = {"type": "input_text", "text": "Hi", key: value}
        req = parse_request(line("/v1/responses", input=[{"role": "user", "content": [part]}]))
        assert req.error is not None or req.messages, (key, value)
