"""What an engine has done, counted as it steps: the worker sends them (engine.stats()) with its
answers, for the report and the live progress (workers/main.py).

Its own module so that the engine and the parts it delegates to (workers/llama/slot_kv.py) count into
the same object without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass

from .scheduler import Span


@dataclass
class StepCounters:
    """What the engine has done, for the report and the live progress. step_s - decode_s -
    sample_s is the engine's own Python work; tg_*: the steps that only generate (one token per
    sequence), llama-batched-bench's S_TG."""

    steps: float = 0.0
    step_s: float = 0.0
    decode_s: float = 0.0
    sample_s: float = 0.0
    batch_tokens: float = 0.0
    busy_slots: float = 0.0
    generated_tokens: float = 0.0
    kv_full_retries: float = 0.0
    preemptions: float = 0.0
    moves: float = 0.0
    tg_steps_s: float = 0.0
    tg_tokens: float = 0.0
    ballast_tokens: float = 0.0
    grammar_tokens: float = 0.0  # tokens picked under a grammar (AnswerSpec)
    grammar_resamples: float = 0.0  # of those, picked again because the grammar refused the first pick
    choice_answers: float = 0.0  # fixed choices answered from the first position's logits
    logprob_tokens: float = 0.0  # tokens whose log-probabilities were asked (GenerationParams.token_logprobs)
    logprob_s: float = 0.0  # spent computing them (part of sample_s, unless worked out during a decode)
    # Of those, worked out during the decode after their step (workers/llama/later_logprobs.py: with
    # llama.cpp's threads on fewer cores than the worker has), and the time the steps waited for them
    # once that decode had returned
    logprob_later_tokens: float = 0.0
    logprob_wait_s: float = 0.0
    chains_spread: float = 0.0  # tokens picked by sampler chains run side by side on the worker's cores
    # The prefix cache (workers/engine/prefix_cache.py): prompt tokens decoded (the shared prefix's
    # included) and taken from KV already held; admissions that started from another question's
    # prompt; whole-stream copies; the most prompt tokens free slots kept at once.
    prompt_computed: float = 0.0
    prompt_reused: float = 0.0
    prefix_hits: float = 0.0
    stream_copies: float = 0.0
    kept_tokens_peak: float = 0.0
    # Samples (SamplingParams.n) started from a copy of their question's prompt KV, not computing it
    sample_forks: float = 0.0

    def step(self, spans: list[Span], busy: int, seconds: float) -> None:
        n_tokens = sum(s.n for s in spans)
        self.steps += 1
        self.step_s += seconds
        self.batch_tokens += n_tokens
        self.busy_slots += busy
        if spans and n_tokens == len(spans):
            self.tg_steps_s += seconds
            self.tg_tokens += n_tokens
