"""OpenAI Batch output files: one line per request, in input order, as the Batch API writes them
(and the openai package's types read them):

    {"id": "batch_req_…", "custom_id": "q1", "error": null, "response": {"status_code": 200,
     "request_id": "req_…", "body": <a chat.completion, a text_completion for /v1/completions,
     or a response for /v1/responses (openai_responses.py)>}}

The body's usage is the answer's own token counts and its model the GGUF's general.name (else
its file name). A line without an answer has "response": null and "error": {"code", "message"};
a request refused as asked (a stream, an embeddings url, an unknown body field) also carries the
400 response OpenAI gives such a line. Codes: invalid_request, failed (the model could not answer
it: a prompt its tokenizer cannot take, longer than the context, a worker that died on it),
not_answered (the run ended first).

A sample of several (n) that has no answer (cut before its choice or grammar was complete) is a
chat choice whose content is null, or a completion choice whose text is "" beside an "error" key
saying why.

Ids are derived from the custom_id and the time of its answer (the run's start for a line without
one): unique in a file, and the same when a rerun rewrites an answer its journal kept.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ....workers.protocol import Answer, FinishReason, Sample
from .openai_responses import response_body
from .rows import OutputSpec, Row, answer_logprobs, shown_answer
from .token_logprobs import completion_logprobs


def batch_line(row: Row, spec: OutputSpec) -> dict[str, Any]:
    """One output line (a BatchRequestOutput of the API reference)."""
    when = row.answer.created if row.answer is not None and row.answer.created else spec.started
    key = hashlib.blake2b(f"{row.qid}\0{when!r}".encode(), digest_size=12).hexdigest()
    line: dict[str, Any] = {"id": f"batch_req_{key}", "custom_id": row.qid, "response": None, "error": None}
    if row.error is None and row.answer is not None:
        line["response"] = {"status_code": 200, "request_id": f"req_{key}", "body": _body(row.answer, row.qid, spec,
                                                                                           key, when)}
    elif row.qid in spec.refused:
        error = {"message": row.error, "type": "invalid_request_error", "param": None, "code": None}
        line["response"] = {"status_code": 400, "request_id": f"req_{key}", "body": {"error": error}}
        line["error"] = {"code": "invalid_request", "message": row.error}
    else:
        line["error"] = {"code": "not_answered" if row.answer is None else "failed", "message": row.error}
    return line


def _body(answer: Answer, qid: str, spec: OutputSpec, key: str, when: float) -> dict[str, Any]:
    """A chat.completion, or a text_completion whose text is the continuation exactly as made;
    one choice per sample (`index` in sample order) when the line asked for several."""
    usage = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
             "total_tokens": answer.prompt_tokens + answer.completion_tokens}
    samples = answer.samples or (Sample(answer.text, answer.finish_reason, answer.completion_tokens,
                                        answer.token_logprobs, answer.in_thinking),)
    if qid in spec.responses:
        return response_body(answer, spec, key, when, _weighed(answer))
    completion = qid in spec.completions
    picked = answer.answer_norm is not None
    choices = [_completion_choice(i, s) if completion else _chat_choice(i, s, picked) for i, s in enumerate(samples)]
    choices[0].update(_weighed(answer))
    if completion:
        return {"id": f"cmpl-{key}", "object": "text_completion", "created": int(when), "model": spec.model_name,
                "choices": choices, "usage": usage}
    return {"id": f"chatcmpl-{key}", "object": "chat.completion", "created": int(when), "model": spec.model_name,
            "choices": choices, "usage": usage}


def _weighed(answer: Answer) -> dict[str, Any]:
    """A choices answer's extra keys beside its choice (the openai package's types keep unknown
    keys): each choice's log-probability (answer.logprobs) and, scored by log-likelihood,
    lm-eval's acc_norm pick (`answer_norm`; the content is the acc pick)."""
    out: dict[str, Any] = {}
    if answer.choice_logprobs is not None:
        out["choice_logprobs"] = answer.choice_logprobs
    if answer.answer_norm is not None:
        out["answer_norm"] = answer.answer_norm
    return out


def _finish(sample: Sample) -> str:
    return "length" if sample.finish_reason is FinishReason.LENGTH else "stop"


def _completion_choice(index: int, sample: Sample) -> dict[str, Any]:
    tokens = sample.token_logprobs
    choice = {"index": index, "text": sample.text, "finish_reason": _finish(sample),
              "logprobs": completion_logprobs(tokens) if tokens is not None else None}
    if sample.error:
        # A sample without an answer (cut before its grammar was complete): its text stays "" as the
        # openai package's Completion type needs a string, so an extra key (kept by those types) says
        # it has none, where a chat choice's content is null.
        choice["error"] = sample.error
    return choice


def _chat_choice(index: int, sample: Sample, picked: bool) -> dict[str, Any]:
    thinking, text = shown_answer(sample.text, picked, sample.in_thinking)
    # a sample without an answer (cut before its choice or grammar was complete) has no content
    message: dict[str, Any] = {"role": "assistant", "content": None if sample.error else text, "refusal": None}
    if thinking is not None:  # always, as vLLM's and llama-server's reasoning parsers give it
        message["reasoning_content"] = thinking  # where vLLM and DeepSeek's API put it
    # the content's own tokens: not the thinking that reasoning_content holds
    tokens = sample.token_logprobs
    logprobs = {"content": answer_logprobs(sample.text, tokens, sample.in_thinking),
                "refusal": None} if tokens is not None else None
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": _finish(sample)}
