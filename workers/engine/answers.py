"""A finished sequence's Answer, and what its generation settings say about how its tokens are
picked. Pure: the sequence, its generation settings and the worker's id in, an Answer out (the
engine, workers/llama/engine.py, calls these when a sequence finishes or is turned away).
"""

from __future__ import annotations

import time
from typing import Optional

from ..protocol import Answer, FinishReason, GenerationParams, Question, TokenLogprob
from .constraints import best_choice, choice_logprobs, choice_text
from .logprobs import answer_tokens
from .sequence import Sequence


def answer(seq: Sequence, gen: GenerationParams, worker_id: int, complete: bool = True) -> Answer:
    """The Answer of a finished sequence (`gen`: its question's generation settings, or the job's).
    `complete`: whether an answer held to choices or a grammar got to their end (Picker.answer_complete);
    one cut before (by max_tokens, mostly inside the thinking) fails, with its finish_reason (`length`)
    rather than `error`: the coordinator counts such answers apart (runner/watch/tally.py)."""
    now = time.perf_counter()
    text, n_out, logprobs = answer_text(seq, gen)
    error = seq.error or (None if complete else cut_error(seq, gen))
    finish = FinishReason.ERROR if seq.error else seq.finish or FinishReason.STOP
    return Answer(qid=seq.question.qid, text="" if error else text, finish_reason=finish,
                  prompt_tokens=seq.n_prompt, completion_tokens=n_out, worker_id=worker_id,
                  ttft_s=max(0.0, seq.t_first - seq.t_admit), latency_s=now - seq.t_admit, error=error,
                  created=time.time(), choice_logprobs=None if error else logprobs,
                  prompt_decoded=seq.n_cached >= seq.n_prompt,
                  token_logprobs=None if error else answer_logprobs(seq, gen), in_thinking=in_thinking(seq))


def in_thinking(seq: Sequence) -> bool:
    """Its output ended before its thinking block did (or before saying whether it thinks)."""
    return seq.thinking and bool(seq.output)


def cut_error(seq: Sequence, gen: GenerationParams) -> str:
    """Why an answer held to choices or a grammar, cut before it was complete, has none."""
    ran_out = len(seq.output) >= gen.max_tokens
    filled = not ran_out and seq.finish is FinishReason.LENGTH
    limit = (f"max_tokens ({gen.max_tokens}) ran out" if ran_out else "the context filled" if filled else
             "a stop string ended it" if seq.stop_cut is not None else "the model ended its output")
    must = "one of the choices" if gen.answer is not None and gen.answer.choices else "complete under its grammar"
    advice = ": raise model.n_ctx (--n-ctx)" if filled else ""
    if in_thinking(seq):
        bounded = gen.thinking is not None and gen.thinking.budget is not None
        advice = f": raise max_tokens or {'lower' if bounded else 'set'} a thinking budget below it" if ran_out \
            else advice
        return f"{limit} while the model was thinking, before its answer (which must be {must}){advice}"
    return f"{limit} before the answer was complete (it must be {must}){': raise max_tokens' if ran_out else advice}"


def answer_logprobs(seq: Sequence, gen: GenerationParams) -> Optional[tuple[TokenLogprob, ...]]:
    """The log-probabilities of the tokens the answer holds: not the end-of-generation token, and
    with a stop string (the answer's text is cut where it begins) the tokens that start before
    the cut, the one it begins inside kept whole (answer_tokens)."""
    if gen.token_logprobs is None or seq.error:
        return None
    # a choice answered from the logits has one entry, after those of any thinking before it
    kept = seq.logprobs[:len(seq.output) + (1 if seq.choice_scores is not None else 0)]
    if seq.stop_cut is not None:
        kept = kept[:answer_tokens([t.piece for t in kept], seq.stop_cut)]
    return tuple(kept)


def answer_text(seq: Sequence, gen: GenerationParams) -> tuple[str, int, Optional[dict[str, float]]]:
    """(text, completion tokens, choice log-probabilities) of a finished sequence."""
    spec = gen.answer
    if seq.error:
        return "", len(seq.output), None
    if spec is not None and seq.choice_scores is not None:
        logprobs = choice_logprobs(spec.choices, seq.choice_scores) if spec.logprobs else None
        # the thinking before it stays in the text, cut from the answer as a generated one's
        return seq.text() + spec.choices[best_choice(seq.choice_scores)], len(seq.output) + 1, logprobs
    text = seq.text()
    return (choice_text(text, spec.choices) if spec is not None and spec.choices else text), len(seq.output), None


def rejected(question: Question, worker_id: int, why: str) -> Answer:
    """The Answer of a question turned away before any of it went into the model."""
    n_prompt = len(question.tokens) + sum(len(c) for c in question.continuations)
    return Answer(qid=question.qid, text="", finish_reason=FinishReason.ERROR, prompt_tokens=n_prompt,
                  worker_id=worker_id, error=why, prompt_decoded=False)


def from_logits(seq: Sequence) -> bool:
    """Its next position is answered from the logits (fixed choices, after any thinking)."""
    return seq.choice_tokens is not None and not seq.thinking


def needs_sampler(gen: GenerationParams) -> bool:
    """Plain greedy needs no sampler state: one argmax per row does it (the engine's _sample), a
    grammar included (it is asked about the argmax). Sampling, a penalty or a logit bias need
    llama.cpp's chain."""
    sampling = gen.sampling
    penalised = sampling.repeat_penalty != 1.0 or bool(sampling.presence_penalty or sampling.frequency_penalty)
    return sampling.temperature > 0 or penalised or bool(gen.logit_bias)
