"""A journal entry: one answer as a line of the journal (entry_of), and back (answer_of)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ...workers.protocol import Answer, FinishReason, Sample
from ..files.formats.token_logprobs import from_journal, to_journal


def entry_of(answer: Answer, prompt: str, record: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"qid": answer.qid, "prompt": prompt, "record": record, "text": answer.text,
                             "finish_reason": answer.finish_reason.value, "prompt_tokens": answer.prompt_tokens,
                             "completion_tokens": answer.completion_tokens, "worker_id": answer.worker_id,
                             "ttft_s": round(answer.ttft_s, 4), "latency_s": round(answer.latency_s, 4),
                             "error": answer.error, "created": answer.created,
                             "choice_logprobs": answer.choice_logprobs}
    # after "error", which runner/journal/index.py finds by a regex as the first such key after
    # "text": the keys between are ggbatch's own, and choice_logprobs' keys are choices' texts
    if answer.token_logprobs is not None:
        entry["token_logprobs"] = to_journal(answer.token_logprobs)
    if answer.answer_norm is not None:
        entry["answer_norm"] = answer.answer_norm
    if answer.in_thinking:  # only when set: an entry without it (any older one) ended after its thinking
        entry["in_thinking"] = True
    if answer.samples is not None:
        entry["samples"] = [[s.text, s.finish_reason.value, s.completion_tokens,
                             to_journal(s.token_logprobs) if s.token_logprobs is not None else None]
                            + ([s.in_thinking, s.error] if s.error else [True] if s.in_thinking else [])
                            for s in answer.samples]
    return entry


def answer_of(e: Mapping[str, Any]) -> Answer:
    return Answer(qid=e["qid"], text=e["text"], finish_reason=FinishReason(e["finish_reason"]),
                  prompt_tokens=e["prompt_tokens"], completion_tokens=e["completion_tokens"],
                  worker_id=e["worker_id"], ttft_s=e["ttft_s"], latency_s=e["latency_s"], error=e["error"],
                  created=e.get("created", 0.0), choice_logprobs=e.get("choice_logprobs"),
                  token_logprobs=from_journal(e.get("token_logprobs")), samples=samples_of(e.get("samples")),
                  answer_norm=e.get("answer_norm"), in_thinking=e.get("in_thinking", False))


def samples_of(data: Optional[list[list[Any]]]) -> Optional[tuple[Sample, ...]]:
    """[text, finish_reason, completion_tokens, token_logprobs] per sample, then whether it ended
    inside its thinking (true, or left out when not and it has an answer) and why it has no answer
    (left out when it has one)."""
    if data is None:
        return None
    return tuple(Sample(s[0], FinishReason(s[1]), s[2], from_journal(s[3]), bool(s[4:5] and s[4]),
                        s[5] if len(s) > 5 else None) for s in data)
