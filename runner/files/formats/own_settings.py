"""A question's own generation settings: what its line of the question file asks for (an OpenAI
Batch line's max_tokens, temperature, top_p, seed, stop, penalties, logit_bias, response_format,
logprobs),
laid over the job's. Pure.

A question with settings of its own carries them to the worker (Question.generation); one whose
settings come out equal to the job's carries None, like every question of a plain question file.
The settings decide the answer, so identical prompts are answered once only when their settings
are equal too, and a journaled answer is reused only when they are unchanged (settings_key).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Optional

from ....workers.protocol import RESPONSE_FORMAT_ENFORCED, AnswerSpec, GenerationParams, ResponseFormat


@dataclass(frozen=True, kw_only=True)
class QuestionSettings:
    """What one line asks for; None (or empty) where it takes the job's setting."""

    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None  # this question's sampling seed, used as given
    stop: Optional[tuple[str, ...]] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), by token id
    response_format: Optional[ResponseFormat] = None
    # alternatives per token with each token's log-probability; NO_LOGPROBS: none, whatever the job says
    token_logprobs: Optional[int] = None
    n: Optional[int] = None  # answers (samples) to draw
    reasoning_effort: Optional[str] = None  # none, minimal, low, medium, high (runner/config/reasoning.py)


NO_LOGPROBS = -1  # a line that says `logprobs: false`
# Sampling settings at a default that journals written before the setting existed do not hold:
# left out of a journal's hashes and fingerprint there, so those journals stay valid
NEWER_SAMPLING_DEFAULTS = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# a line's response_format {"type": "text"}: free text, whatever the job's answer.* holds it to
PLAIN_TEXT = ResponseFormat("text")


def own_generation(job: GenerationParams, own: QuestionSettings, stop: tuple[str, ...],
                   grammar: Optional[str] = None) -> Optional[GenerationParams]:
    """The settings a question is answered with, or None when they are the job's. `stop`: its stop
    strings unless the line names its own (the job's, else the plain template's for a chat prompt;
    a raw completion prompt has no template, so no template stop). `grammar`: its response_format
    as GBNF (runner/config/answer.py format_grammar), which replaces the job's answer.*, as a
    PLAIN_TEXT response_format does with none."""
    asked = {name: value for name in ("temperature", "top_p", "seed", "n", "presence_penalty", "frequency_penalty")
             if (value := getattr(own, name)) is not None}
    sampling = replace(job.sampling, **asked)
    logprobs = job.token_logprobs if own.token_logprobs is None else \
        None if own.token_logprobs == NO_LOGPROBS else own.token_logprobs
    text = own.response_format == PLAIN_TEXT  # nothing to enforce, so no format goes to the worker
    gen = replace(job, max_tokens=own.max_tokens or job.max_tokens, stop=own.stop or stop, sampling=sampling,
                  logit_bias=own.logit_bias, response_format=None if text else own.response_format,
                  answer=AnswerSpec(grammar=grammar) if grammar is not None else None if text else job.answer,
                  token_logprobs=logprobs)
    return None if gen == job else gen


def samples_problem(own: QuestionSettings, job: GenerationParams) -> Optional[str]:
    """Why a line's n samples cannot be drawn: greedy decoding (the line's temperature, else the
    job's) would give n identical answers."""
    n = job.sampling.n if own.n is None else own.n
    temperature = job.sampling.temperature if own.temperature is None else own.temperature
    if n <= 1 or temperature > 0:
        return None
    whose = "give body.temperature; the job is greedy" if own.temperature is None else \
        f"body.temperature is {own.temperature:g}"
    if own.n is None:  # the n is the job's: name it, not a body.n the line does not have
        return (f"sampling.n (--n {n}) of the job: {n} samples need a temperature > 0 ({whose}), else they are "
                f"{n} identical answers: give this line \"n\": 1, or a temperature > 0")
    return f"body.n: {n} samples need a temperature > 0 ({whose}), else they are {n} identical answers"


def vocabulary_problem(own: QuestionSettings, n_vocab: int) -> Optional[str]:
    """Why a line's logit_bias cannot apply to this model (a token id outside its vocabulary)."""
    for token, _ in own.logit_bias:
        if token >= n_vocab:
            return f"body.logit_bias: token {token} is not in the model's vocabulary (ids 0-{n_vocab - 1})"
    return None


def is_greedy(gen: GenerationParams) -> bool:
    return gen.sampling.temperature <= 0


def settings_key(gen: GenerationParams) -> bytes:
    """A question's own settings as bytes for the journal's prompt hash. A response format also
    records whether it was enforced, so answers made before the grammar are not reused after.
    Settings at their default that older journals never had (one sample, no token
    log-probabilities) are left out, so those journals' hashes still match."""
    data = asdict(gen)
    for name, default in NEWER_SAMPLING_DEFAULTS.items():
        if data["sampling"][name] == default:
            del data["sampling"][name]
    if data["token_logprobs"] is None:
        del data["token_logprobs"]
    if data["answer"] is not None and not data["answer"]["texts"]:
        del data["answer"]["texts"]  # choices scored as themselves
    if gen.thinking is None:
        del data["thinking"]  # a model that does not think: the hash its journals were written with
    if gen.response_format is not None:
        data["response_format_enforced"] = RESPONSE_FORMAT_ENFORCED
    return json.dumps(data, sort_keys=True).encode()


def describe_own(generations: list[GenerationParams]) -> dict[str, int]:
    """For the report, and the answers file's columns: how many questions have settings of their
    own, which response formats they ask for, and how many draw samples or take token log-probabilities."""
    counts: dict[str, int] = {"questions": len(generations)}
    for gen in generations:
        if gen.response_format is not None:
            key = f"response_format.{gen.response_format.type}"
            counts[key] = counts.get(key, 0) + 1
        if gen.logit_bias:
            counts["logit_bias"] = counts.get("logit_bias", 0) + 1
        if gen.answer is not None and gen.answer.choices:
            counts["answer.choices"] = counts.get("answer.choices", 0) + 1
        if gen.sampling.n > 1:
            counts["n"] = counts.get("n", 0) + 1
        if gen.token_logprobs is not None:  # the answers file plans a token_logprobs column from it, as samples from n
            counts["token_logprobs"] = counts.get("token_logprobs", 0) + 1
    return counts
