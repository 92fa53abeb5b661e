"""The OpenAI Responses API's lines in an OpenAI Batch file (url /v1/responses): the request's
messages and settings, and the `response` object its answer is written as (the openai package's
Response type reads it).

    {"custom_id": "q1", "method": "POST", "url": "/v1/responses",
     "body": {"model": "gpt-4.1-mini", "instructions": "Be brief.", "input": "2+2?", "max_output_tokens": 64}}

Honoured: `input` (a string, or messages: a role and a content, whose text parts are input_text,
or output_text in an assistant's), `instructions` (a system message before them),
`max_output_tokens`, `temperature`, `top_p`, `text.format` (text, json_object, json_schema),
`reasoning.effort`, and `top_logprobs` with `include: ["message.output_text.logprobs"]`. The
fields about who asks or how OpenAI keeps the request are taken and not used, as on chat lines
(openai_request.py UNSEEN). The API has no `n`, `stop` or `seed`.

The answer is a message item with one output_text part; a reasoning model's thinking a
reasoning item before it (its text as a reasoning_text part; no summary). A cut answer is
`status: incomplete` with `incomplete_details.reason: max_output_tokens`. The usage's
cached_tokens and reasoning_tokens are 0: ggbatch does not count them apart.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ....workers.protocol import Answer, FinishReason, ResponseFormat
from ...errors import quote
from .openai_checks import (
    INT32_MAX,
    Refused,
    body_value,
    effort,
    integer,
    number,
    role,
    schema_format,
    text_parts,
    utf8,
)
from .own_settings import PLAIN_TEXT, QuestionSettings
from .rows import OutputSpec, answer_logprobs, shown_answer

HONOURED = ("input", "instructions", "model", "max_output_tokens", "temperature", "top_p", "text", "reasoning",
            "top_logprobs", "include")
LOGPROBS = "message.output_text.logprobs"  # the include that asks for the answer's token log-probabilities
MAX_TOP_LOGPROBS = 20
TEXT_KINDS = ("input_text", "output_text")  # a message's text parts: the caller's, an earlier answer's
MESSAGE_KEYS = {"role", "content", "type", "id", "status"}  # an earlier answer given back has an id and status
# A chat line's fields the checks shared with chat lines name (runner/questions/maker.py,
# runner/config/reasoning.py), as this API names them (openai_request.py Request.field)
CHAT_NAMES = {"messages": "input", "reasoning_effort": "reasoning.effort", "max_tokens": "max_output_tokens"}


def responses_messages(body: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The conversation the line asks to continue: its instructions as a system message, then
    its input."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise Refused(f"body.instructions: must be a string, got {quote(instructions)}")
    system = (("system", utf8("body.instructions", instructions)),) if instructions else ()
    given = body.get("input")
    if isinstance(given, str) and given:
        return (*system, ("user", utf8("body.input", given)))
    if not isinstance(given, list) or not given:
        raise Refused("body.input: must be a non-empty string or a non-empty list of messages")
    return (*system, *(_message(f"body.input[{i}]", item) for i, item in enumerate(given)))


def _message(where: str, item: Any) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise Refused(f"{where}: must be a message: an object with a role and a content")
    kind = item.get("type", "message")
    if kind != "message":
        raise Refused(f"{where}.type: {quote(kind)} is not answered here (messages only: no tools, files or images)")
    extra = {k for k, v in item.items() if v is not None} - MESSAGE_KEYS
    if extra:
        raise Refused(f"{where}.{sorted(extra)[0]}: not supported (a message has a role and a content)")
    return role(where, item.get("role")), text_parts(f"{where}.content", item.get("content"), TEXT_KINDS)


def responses_settings(body: Mapping[str, Any]) -> QuestionSettings:
    return QuestionSettings(
        max_tokens=body_value(body, "max_output_tokens", integer(1, INT32_MAX)),
        temperature=body_value(body, "temperature", number(0.0, 2.0)),
        top_p=body_value(body, "top_p", number(0.0, 1.0, lo_open=True)),
        response_format=_text_format(body.get("text")),
        token_logprobs=_token_logprobs(body),
        reasoning_effort=_effort(body.get("reasoning")))


def _text_format(text: Any) -> Optional[ResponseFormat]:
    """text.format: what the answer must be, as chat's response_format says it (the schema's
    name, schema and strict beside its type rather than under json_schema)."""
    if text is None:
        return None
    if not isinstance(text, dict) or {k for k, v in text.items() if v is not None} - {"format"}:
        raise Refused("body.text: takes only format (text, json_object or json_schema)")
    spec = text.get("format")
    if spec is None:
        return None
    kind = spec.get("type") if isinstance(spec, dict) else None
    try:
        if kind in ("text", "json_object") and len(spec) == 1:
            return PLAIN_TEXT if kind == "text" else ResponseFormat("json_object")
        if kind == "json_schema":
            return schema_format({k: v for k, v in spec.items() if k != "type"}, "json_schema")
    except ValueError as exc:
        raise Refused(f"body.text.format: {exc}") from None
    raise Refused("body.text.format: must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                  f"\"json_schema\", \"name\": ..., \"schema\": {{...}}}}, got {quote(spec)}")


def _token_logprobs(body: Mapping[str, Any]) -> Optional[int]:
    """The alternatives per token asked for with the answer's log-probabilities (include's
    message.output_text.logprobs, with top_logprobs, 0 when absent); None: not asked (the job's
    setting)."""
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise Refused(f"body.include: must be a list of strings, got {quote(include)}")
    other = [i for i in include if i != LOGPROBS]
    if other:
        raise Refused(f"body.include: {quote(other[0])} is not given here (only {LOGPROBS})")
    k = body_value(body, "top_logprobs", integer(0, MAX_TOP_LOGPROBS))
    if LOGPROBS not in include:
        if k is not None:
            raise Refused(f"body.top_logprobs: needs body.include [\"{LOGPROBS}\"]")
        return None
    return k or 0


def _effort(reasoning: Any) -> Optional[str]:
    """reasoning.effort, the thinking budget; its summary is taken (the thinking itself is given)."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary", "generate_summary"}:
        raise Refused("body.reasoning: takes effort (and summary)")
    said: Optional[str] = body_value(reasoning, "effort", effort, "body.reasoning")
    return said


def response_body(answer: Answer, spec: OutputSpec, key: str, when: float,
                  weighed: Mapping[str, Any]) -> dict[str, Any]:
    """The `response` object of one answer; `weighed`: a choices answer's extra keys, set on its
    output_text part (the openai package's types keep unknown keys)."""
    thinking, text = shown_answer(answer.text, answer.answer_norm is not None, answer.in_thinking)
    cut = answer.finish_reason is FinishReason.LENGTH
    status = "incomplete" if cut else "completed"
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], **weighed}
    if answer.token_logprobs is not None:
        part["logprobs"] = answer_logprobs(answer.text, answer.token_logprobs, answer.in_thinking)
    output: list[dict[str, Any]] = []
    if thinking is not None:
        output.append({"type": "reasoning", "id": f"rs_{key}", "summary": [], "status": "completed",
                       "content": [{"type": "reasoning_text", "text": thinking}]})
    output.append({"type": "message", "id": f"msg_{key}", "status": status, "role": "assistant", "content": [part]})
    usage = {"input_tokens": answer.prompt_tokens, "output_tokens": answer.completion_tokens,
             "total_tokens": answer.prompt_tokens + answer.completion_tokens,
             "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}
    return {"id": f"resp_{key}", "object": "response", "created_at": int(when), "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "model": spec.model_name,
            "output": output, "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "usage": usage}
