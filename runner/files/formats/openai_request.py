"""One line of an OpenAI Batch input file, checked: the messages (/v1/chat/completions; the input
of /v1/responses, openai_responses.py) or the prompt (/v1/completions) it asks to answer and its
own generation settings, or, when ggbatch cannot answer it as asked, why. Pure: no model needed.

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 64}}

A body field is honoured (max_tokens or max_completion_tokens, temperature, top_p, seed, stop,
presence_penalty and frequency_penalty, response_format, logit_bias, logprobs and top_logprobs, n,
reasoning_effort as a thinking budget), ignored (model: the job's model answers every line; user,
metadata and the other fields about the caller or the service, not the answer: UNSEEN), accepted
at its neutral value only (stream false; a response's background false, truncation disabled), or
refused. A refused line is answered
with the reason, which names the field, and the rest of the file is answered, as OpenAI answers a
bad line of a batch with a 400. A field set to null is one not given, as OpenAI reads it. A
setting the line leaves out (or sets to null) is the job's, not OpenAI's default
(the job is greedy by default, where OpenAI samples at temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ....workers.protocol import ResponseFormat
from ...errors import quote
from . import openai_responses as responses
from .openai_checks import (
    INT32_MAX,
    Refused,
    body_value,
    boolean,
    effort,
    integer,
    messages,
    number,
    schema_format,
    utf8,
)
from .own_settings import NO_LOGPROBS, PLAIN_TEXT, QuestionSettings

CHAT, COMPLETION, RESPONSES = "chat", "completion", "responses"
ENDPOINTS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION, "/v1/responses": RESPONSES}
LINE_KEYS = ("custom_id", "method", "url", "body")
HONOURED = {CHAT: ("messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
                   "stop", "presence_penalty", "frequency_penalty", "response_format", "logit_bias", "logprobs",
                   "top_logprobs", "n", "reasoning_effort"),
            COMPLETION: ("prompt", "model", "max_tokens", "temperature", "top_p", "seed", "stop", "presence_penalty",
                         "frequency_penalty", "logit_bias", "logprobs", "n"),
            RESPONSES: responses.HONOURED}
# Fields about who asks or how OpenAI serves and keeps the request, which do not change its
# answer: taken and not used, as a batch file written for OpenAI holds them
_ABOUT_THE_CALL = ("user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "metadata", "store",
                   "service_tier")
# prediction (Predicted Outputs) makes OpenAI answer sooner, with the answer it gives without it
UNSEEN = {CHAT: (*_ABOUT_THE_CALL, "prediction"), COMPLETION: ("user",), RESPONSES: _ABOUT_THE_CALL}
MAX_N = 128  # samples per line (OpenAI's own limit)
MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_TOP_LOGPROBS = {CHAT: 20, COMPLETION: 5}  # alternatives per token, as OpenAI allows


# field -> (its neutral value as said in an error, the test)
NEUTRAL: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "stream": ("false", lambda v: v is False),
    "background": ("false", lambda v: v is False),  # /v1/responses: answered in the batch, not later
    "truncation": ("disabled", lambda v: v == "disabled"),  # /v1/responses: a prompt too long fails
    "modalities": ('["text"]', lambda v: v == ["text"]),  # an answer in text alone, as ggbatch writes it
    # A line's tools are refused, so no tool is ever called: "none" is what it gets, and whether
    # several calls may run at once does not arise
    "tool_choice": ('"none"', lambda v: v == "none"),
    "parallel_tool_calls": ("true or false", lambda v: isinstance(v, bool)),
}


@dataclass(frozen=True)
class Request:
    endpoint: str  # CHAT, COMPLETION or RESPONSES
    messages: tuple[tuple[str, str], ...] = ()  # chat, responses: (role, content), developer as system
    prompt: Optional[str] = None  # completion: the text as it is, no chat template
    settings: QuestionSettings = QuestionSettings()
    model: Optional[str] = None  # as the line names it: ignored
    error: Optional[str] = None  # why it cannot be answered (nothing else is set then)

    def field(self, chat_name: str) -> str:
        """body.NAME of a chat line's field, as this line names it (a /v1/responses line's
        max_output_tokens for max_tokens: openai_responses.py CHAT_NAMES)."""
        own = responses.CHAT_NAMES.get(chat_name, chat_name) if self.endpoint == RESPONSES else chat_name
        return f"body.{own}"

    @property
    def chars(self) -> int:
        """Characters of its text, before any chat template."""
        return len(self.prompt) if self.prompt is not None else sum(len(c) for _, c in self.messages)


def parse_request(line: Mapping[str, Any]) -> Request:
    """The request one batch line makes (its custom_id is the caller's business)."""
    try:
        return _request(line)
    except Refused as exc:
        url = line.get("url")
        return Request(ENDPOINTS.get(url, CHAT) if isinstance(url, str) else CHAT, error=str(exc))


def _request(line: Mapping[str, Any]) -> Request:
    extra = [k for k in line if k not in LINE_KEYS]
    if extra:
        raise Refused(f"{extra[0]}: not a key of a batch request line ({', '.join(LINE_KEYS)})")
    if line.get("method", "POST") != "POST":
        raise Refused(f"method: must be POST, got {quote(line.get('method'))}")
    url = line.get("url")
    if not isinstance(url, str) or url not in ENDPOINTS:
        *others, last = ENDPOINTS
        raise Refused(f"url: {quote(url)} is not answered here (ggbatch answers {', '.join(others)} and {last})")
    body = line.get("body")
    if not isinstance(body, dict):
        raise Refused("body: must be a JSON object")
    endpoint = ENDPOINTS[url]
    _check_fields(endpoint, body)
    model = body.get("model")
    settings = _settings(body, endpoint)
    if endpoint == CHAT:
        return Request(CHAT, messages=messages("body.messages", body.get("messages")), settings=settings, model=model)
    if endpoint == RESPONSES:
        return Request(RESPONSES, messages=responses.responses_messages(body), settings=settings, model=model)
    return Request(COMPLETION, prompt=_prompt(body.get("prompt")), settings=settings, model=model)


def _check_fields(endpoint: str, body: Mapping[str, Any]) -> None:
    for key, value in body.items():
        if value is None:
            continue  # OpenAI's "not given", as files dumped from the SDK's request objects hold it
        if key == "stream" and value is True:
            raise Refused("body.stream: a batch line cannot stream its answer")
        if key in NEUTRAL:
            said, neutral = NEUTRAL[key]
            if not neutral(value):
                raise Refused(f"body.{key}: only {said} is supported, got {quote(value)}")
        elif key not in HONOURED[endpoint] and key not in UNSEEN[endpoint]:
            raise Refused(f"body.{key}: not supported on {_url(endpoint)} (ggbatch honours "
                          f"{', '.join(HONOURED[endpoint])})")
    if "model" in body and body["model"] is not None and not isinstance(body["model"], str):
        raise Refused(f"body.model: must be a string, got {quote(body['model'])}")


def _url(endpoint: str) -> str:
    return next(url for url, e in ENDPOINTS.items() if e == endpoint)


def _settings(body: Mapping[str, Any], endpoint: str) -> QuestionSettings:
    if endpoint == RESPONSES:
        return responses.responses_settings(body)
    return QuestionSettings(
        max_tokens=_max_tokens(body),
        temperature=body_value(body, "temperature", number(0.0, 2.0)),
        top_p=body_value(body, "top_p", number(0.0, 1.0, lo_open=True)),
        seed=body_value(body, "seed", integer(-2**63, 2**63 - 1)),
        stop=body_value(body, "stop", _stop),
        presence_penalty=body_value(body, "presence_penalty", number(-2.0, 2.0)),
        frequency_penalty=body_value(body, "frequency_penalty", number(-2.0, 2.0)),
        logit_bias=body_value(body, "logit_bias", _logit_bias) or (),
        response_format=body_value(body, "response_format", _response_format),
        token_logprobs=_token_logprobs(body, endpoint),
        n=body_value(body, "n", integer(1, MAX_N)),
        reasoning_effort=body_value(body, "reasoning_effort", effort))


def _token_logprobs(body: Mapping[str, Any], endpoint: str) -> Optional[int]:
    """How many alternatives per token a line asks for with its log-probabilities: chat's
    `logprobs: true` with `top_logprobs` (0 when absent), a completion's `logprobs: k`; NO_LOGPROBS
    for an explicit `logprobs: false` (on either endpoint); None when the line does not say (the job's setting)."""
    top = integer(0, MAX_TOP_LOGPROBS[endpoint])
    if endpoint == COMPLETION:
        # OpenAI's completions take an integer, but false says "none" as on chat (weighing-answers.md)
        return NO_LOGPROBS if body.get("logprobs") is False else body_value(body, "logprobs", top)
    asked = body_value(body, "logprobs", boolean)
    k = body_value(body, "top_logprobs", top)
    if k is not None and asked is not True:
        raise Refused(f"body.top_logprobs: needs body.logprobs true, got {quote(body.get('logprobs'))}")
    if asked is None:
        return None
    return (k or 0) if asked else NO_LOGPROBS


def _max_tokens(body: Mapping[str, Any]) -> Optional[int]:
    check = integer(1, INT32_MAX)
    old: Optional[int] = body_value(body, "max_tokens", check)
    new: Optional[int] = body_value(body, "max_completion_tokens", check)
    if old is not None and new is not None and old != new:
        raise Refused(f"body.max_tokens ({old}) and body.max_completion_tokens ({new}) differ: give one")
    return new if new is not None else old


def _stop(v: Any) -> tuple[str, ...]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"must be a non-empty string or a list of up to {MAX_STOP} of them")
    return tuple(stops)


def _logit_bias(v: Any) -> tuple[tuple[int, float], ...]:
    if not isinstance(v, dict):
        raise ValueError("must map token ids to biases from -100 to 100")
    bias = number(-100.0, 100.0)
    out: dict[int, float] = {}
    for token, value in v.items():
        if not (isinstance(token, str) and token.isascii() and token.isdigit()):
            raise ValueError(f"token {quote(token)} is not a token id")
        try:
            out[int(token)] = bias(value)
        except ValueError as exc:
            raise ValueError(f"token {token}: {exc}") from None
    return tuple(sorted(out.items()))


def _response_format(v: Any) -> ResponseFormat:
    """What the answer must be (see ResponseFormat); PLAIN_TEXT for {"type": "text"}, which is said,
    not left out: it replaces the job's answer.* (its --json-schema or --choices) too."""
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "text" or kind == "json_object":
        if len(v) > 1:
            raise ValueError(f"type {kind} takes no other key")
        return PLAIN_TEXT if kind == "text" else ResponseFormat("json_object")
    if kind != "json_schema":
        raise ValueError("must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
                         "\"json_schema\": {\"name\": ..., \"schema\": {...}}}")
    spec = v.get("json_schema")
    if set(v) != {"type", "json_schema"} or not isinstance(spec, dict):
        raise ValueError("json_schema: must be {\"name\": ..., \"schema\": {...}, \"strict\": ...}")
    return schema_format(spec, "json_schema")


def _prompt(v: Any) -> str:
    if isinstance(v, list) and len(v) == 1:
        v = v[0]
    if not isinstance(v, str) or not v:
        raise Refused("body.prompt: must be one non-empty string (one prompt per line)")
    return utf8("body.prompt", v)
