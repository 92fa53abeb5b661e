"""Several answers to one question (SamplingParams.n) from one computation of its prompt. Pure
bookkeeping: the engine (workers/llama/engine.py) carries it out on the model.

    admit     the question's first sequence (sample 0) takes a slot and holds n-1 more
    prefill   its prompt goes into its slot's KV, as any question's
    fork      at the prompt's last token: its KV copied into the held slots (llama_memory_seq_cp,
              as llama-server's `n` does: tagged cells in a unified pool, a stream copy otherwise,
              the whole state on recurrent memory), one sequence per sample, each drawing its
              first token from that same logits row with a sampler of its own seed
    decode    the samples go on as independent sequences
    answer    one Answer when the last of them finishes, the samples in order

Sample i's seed is sample_seed(question seed, i): a rerun, a crash retry or another layout draws
the same n answers, and sample 0 is the answer the question gets with n = 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from ..protocol import Answer, FinishReason, Sample

SEED_MASK = (1 << 64) - 1
# llama.cpp's dist sampler takes a 32-bit seed and reads 0xFFFFFFFF (LLAMA_DEFAULT_SEED) as "pick
# one at random": a seed that lands there would draw another answer on every run.
LLAMA_RANDOM_SEED = 0xFFFFFFFF
# What that seed draws with instead: half the range away from it, so no question's n samples
# (seed, seed + 1, ...) reach both it and its stand-in and draw one answer twice.
RANDOM_SEED_STANDIN = 0x7FFFFFFF


def sample_seed(seed: int, index: int) -> int:
    """The seed of a question's sample `index`: the question's own for sample 0, then the next
    ones (as vLLM and llama-cpp-python's server seed their n samples)."""
    return (seed + index) & SEED_MASK if index else seed


def llama_seed(seed: int) -> int:
    """The seed llama.cpp's sampler draws with for `seed`: its low 32 bits (a negative seed in two's
    complement, so -1 is 4294967295, and 2**32 + 5 draws as 5; every seed below 0xFFFFFFFF draws as
    it always did), save the one llama.cpp reserves for "random", which draws as RANDOM_SEED_STANDIN."""
    low = seed & 0xFFFFFFFF
    return RANDOM_SEED_STANDIN if low == LLAMA_RANDOM_SEED else low


@dataclass(eq=False)
class SampleSet:
    """A question's samples as they finish (shared by its sequences)."""

    n: int
    forked: bool = False  # the other samples' sequences exist (the prompt is in)
    done: dict[int, Answer] = field(default_factory=dict)

    def finished(self, index: int, answer: Answer) -> Optional[Answer]:
        """Record a finished sample's answer; the question's answer once the last is in (None
        before). A first sample that fails before its prompt is in (no other sample started) is
        the question's answer at once."""
        if not self.forked:
            return answer
        self.done[index] = answer
        if len(self.done) < self.n:
            return None
        answers = [self.done[i] for i in range(self.n)]
        first = answers[0]
        failed = failure(answers)
        return replace(first, finish_reason=(failed or first).finish_reason, error=failed.error if failed else None,
                       completion_tokens=sum(a.completion_tokens for a in answers),
                       latency_s=max(a.latency_s for a in answers), created=max(a.created for a in answers),
                       samples=tuple(Sample(a.text, a.finish_reason, a.completion_tokens, a.token_logprobs,
                                            a.in_thinking, a.error) for a in answers))


def failure(answers: list[Answer]) -> Optional[Answer]:
    """The sample whose failure fails the question, if one does: the first that failed outright
    (FinishReason.ERROR), or the first of them when every sample was cut before its choice or
    grammar was complete (workers/engine/answers.py). A sample cut while others answered is kept
    as a sample without an answer: one long thought does not cost the question its other votes."""
    broken = next((a for a in answers if a.finish_reason is FinishReason.ERROR), None)
    if broken is not None or any(a.error is None for a in answers):
        return broken
    return answers[0]
