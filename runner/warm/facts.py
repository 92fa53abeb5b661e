"""What a pool's layout is planned on: the facts of a call's questions (ggbatch.answer plans for
them as a job does), or, for a warm pool that has none yet, a guess and the prefix every default
prompt shares, found by making two probe questions. The context grows if a later call needs more
(runner/plan/growth.py)."""

from __future__ import annotations

from array import array
from typing import Iterable, Optional, Sequence

from ...workers.protocol import Question
from ..files.inputs import Record
from ..launch import STREAMED
from ..plan.layout import PromptFacts, prompt_length
from ..questions.prepare import common_prefix, max_samples, max_tokens
from ..questions.prompting import Prompting

PROBES = ("a", "b")  # two questions whose prompts' common start is the shared prefix of every default prompt
# the probes' own choices: with answer.choices auto each record brings its own, and a probe is made as one
PROBE_CHOICES = ["a", "b"]
GUESS_PROMPT = 512  # tokens of prompt a warm pool's context is first planned for; it grows if a call needs more
# Auto slots a warm pool's worker starts with; they grow to the layout's cap once calls bring more
# sequences (runner/plan/growth.py). A pipeline's usual calls, a few questions at a time, never
# wait for one of 16, whose KV is a quarter of 64's.
FIRST_WARM_SLOTS = 16


def first_slots(start_small: bool, for_a_call: bool, n_gpu_layers: int) -> Optional[int]:
    """The auto slots a pool's workers start with (None: as many as the plan allows). A warm pool
    starts with few, their KV allocated and cleared as it starts, and grows with its load
    (runner/plan/growth.py). Not a pool made for one call, which knows its load; nor one on a GPU,
    where the VRAM plan sizes the slots already."""
    return FIRST_WARM_SLOTS if start_small and not for_a_call and not n_gpu_layers else None


def probe_records(fields: Iterable[str]) -> list[Record]:
    """The probes, as records with the fields the pool's prompt.template names (its question
    field, by default), each the probe's own text: the probes' prompts part where the first field is."""
    return [Record(q, {**{name: q for name in fields}, "choices": PROBE_CHOICES}, 0) for q in PROBES]


def call_facts(n_records: int, questions: Sequence[Question],
               prompting: Prompting) -> tuple[PromptFacts, array[int], int]:
    """(the facts, the shared prefix, the most tokens an answer may take) of a call's records and
    the questions made of them (fewer where prompts repeat or are refused)."""
    prompts = [q.tokens for q in questions]
    prefix = common_prefix(prompts) if len(prompts) > 1 else array("i")
    samples = max_samples(questions, prompting.generation)  # each a sequence of its own once the prompt is in
    facts = PromptFacts(n_records * samples, max(map(prompt_length, questions), default=1), len(prefix),
                        prompting.info.n_ctx_train, prompting.dims, 0, any(q.continuations for q in questions),
                        samples)
    return facts, prefix, max_tokens(questions, prompting.generation)


def warm_facts(probes: Sequence[Question], prompting: Prompting,
               prefix_cache: bool) -> tuple[PromptFacts, array[int], int]:
    """The same for a warm pool, from its made probes: a prompt of GUESS_PROMPT tokens, the prefix
    the probes share. A warm pool cannot know whether its calls' prompts will share prefixes (an
    lm-eval task's few-shot examples and contexts do): with the prefix cache on (`prefix_cache`)
    its workers keep the cache. submit_questions may bring continuations to score (ggbatch.lm_eval's)."""
    gen = prompting.generation
    prefix = common_prefix([q.tokens for q in probes])
    facts = PromptFacts(STREAMED * gen.sampling.n, GUESS_PROMPT, len(prefix), prompting.info.n_ctx_train,
                        prompting.dims, int(prefix_cache), True, gen.sampling.n)
    return facts, prefix, gen.max_tokens
