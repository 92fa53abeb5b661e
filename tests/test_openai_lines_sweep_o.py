"""OpenAI Batch lines as files dumped from the SDK hold them, and the settings a line states
explicitly (sweep O): a null field is one not given; a line's own plain-text response_format,
`logprobs: false` on /v1/completions, and the messages that name where a refused setting comes from."""

import pytest

from ggbatch.runner.files.formats.openai_request import parse_request

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
