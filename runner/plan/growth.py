"""A streamed file's context per sequence, grown as its windows come; a warm pool's slots, grown
once its calls bring more sequences than it started with.

The layout is settled on the first window (runner/job.py): its longest prompt, and for a
streamed file a guess of the longest line from the file's bytes. A later window may still hold a
prompt that context cannot take: a small vocabulary makes more tokens of the same characters, and
a resumed file's first window may hold nothing left to answer. Such a question is not failed.
When the pool takes the window, the context grows to what each of its questions needs (its prompt
and its max_tokens, capped by the model's training context, as the context of a file of one
window is sized), within the memory of the first plan; the workers finish what they hold, get
nothing new meanwhile, and build the larger context in place, on the weights they loaded
(runner/pool/pool.py reconfigure; workers/main.py _Engines).

    window ─▶ need (longest prompt + its max_tokens) ─▶ fits the context? ─▶ as it is
                                                     └▶ the largest context ≤ need the memory
                                                        holds (runner/plan/layout.py settled)
                                                        ─▶ pool.reconfigure(engines)

A question fails for its length only when the model's context, the job's model.n_ctx, or the
memory the plan allows cannot hold it.

A warm pool's slots grow the same way. Before its first call it cannot know its load, and every
slot's KV is allocated and cleared as the workers start (about 2.6 GB and several seconds for
64 slots of 769 tokens on a 28-layer model), so with auto slots it starts with at most
FIRST_WARM_SLOTS a worker (runner/warm/facts.py first_slots). The first time its open questions' sequences
outnumber its slots, it is planned as a job is, for as many slots as the auto cap and the memory
allow, once.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from ...workers.protocol import EngineConfig, GenerationParams, Question
from ..words import counted
from . import layout as layouts
from .layout import Layout, PromptFacts, answer_tokens, prompt_length
from .memory import MemoryPlan, describe
from .nodes import NodePlan

log = logging.getLogger("ggbatch")


@dataclass(frozen=True)
class PlanInputs:
    """What the first settle was given, kept to settle again with a larger context."""

    started: NodePlan  # the workers as started (runner/plan/layout.py phase 1)
    facts: tuple[PromptFacts, ...]  # each node's
    available: tuple[int, ...]  # each node's memory for the plan, as the first settle saw it
    slots: Optional[int]  # the job's (None: auto)
    n_batch: Optional[int]
    n_ctx: Optional[int]  # the job's model.n_ctx (None: auto); a context asked for never grows
    offload: bool


class ContextGrowth:
    """The layout now and the engines it gives; grows when a window needs more context, or a warm
    pool's calls more slots."""

    def __init__(self, inputs: PlanInputs, plan: NodePlan, memory: Sequence[MemoryPlan], model_path: str,
                 prefix: array[int], generation: GenerationParams, slot_caps: Sequence[int] = ()) -> None:
        # flash attention is decided once, on the first window: a context grown past
        # runner/plan/attention.py's CPU bound keeps it, as the rest of the file's answers do
        self.inputs = replace(inputs, started=inputs.started.with_flash_attn([lay.flash_attn for lay in plan.layouts]))
        self.plan, self.memory = plan, list(memory)
        self.model_path, self.prefix, self.generation = model_path, prefix, generation
        self._said_short = 0  # the largest context the memory could not hold, said once
        # each node's cap on auto slots once the load asks for more (a warm pool's; () : as started)
        self._slot_caps_later = tuple(slot_caps)

    @property
    def n_ctx_seq(self) -> int:
        return min(lay.n_ctx_seq for lay in self.plan.layouts)

    def engines(self) -> dict[int, EngineConfig]:
        """Each worker's engine, from its node's layout."""
        per_node = [layouts.engine_config(self.model_path, lay, self.prefix, self.generation)
                    for lay in self.plan.layouts]
        return {wid: per_node[k] for wid, k in self.plan.node_of().items()}

    def engines_for(self, questions: Sequence[Question]) -> Optional[dict[int, EngineConfig]]:
        """The workers' new engines when these questions need a larger context than the plan's
        (None: they fit, or no larger context can be had)."""
        if self.inputs.n_ctx is not None:
            return None
        want = context_needed(questions, self.generation, self.inputs.facts[0].n_ctx_train)
        if want <= self.n_ctx_seq:
            return None
        n_ctx_seq = self._largest_fitting(want)
        if n_ctx_seq < want and want > self._said_short:
            self._said_short = want
            log.warning("a question needs a context of %d tokens per sequence, the memory plan holds %d at most: "
                        "a longer prompt fails (%s)", want, n_ctx_seq, describe(self._plans(want)[0][1]))
        if n_ctx_seq <= self.n_ctx_seq:
            return None
        log.info("questions came that need %d tokens of context per sequence (a later window of the file, or a "
                 "pool's call): the context grows from %d to %d tokens (each worker builds it in place once it "
                 "has answered what it holds)", want, self.n_ctx_seq, n_ctx_seq)
        return self._replanned(self._plans(n_ctx_seq))

    @property
    def slots(self) -> int:
        """Sequences decoded together, over every worker."""
        return sum(lay.workers * lay.slots for lay in self.plan.layouts)

    @property
    def per_worker(self) -> int:
        """The slots every worker has now (the fewest of any node's)."""
        return min(lay.slots for lay in self.plan.layouts)

    @property
    def most_per_worker(self) -> int:
        """The most slots a worker can come to hold: what it has, or the auto cap a warm pool may
        still grow to (the memory may allow fewer)."""
        return max(self.per_worker, min(self._slot_caps_later, default=0))

    def engines_for_load(self, sequences: int, widest: int) -> Optional[dict[int, EngineConfig]]:
        """The workers' new engines when `sequences` (those a warm pool's open calls hold) outnumber
        the slots it started with, or a question's `widest` samples (decoded together, in one
        worker) a worker's: planned for every slot the auto cap and the memory allow, once (None:
        no larger plan to grow to)."""
        per_worker = self.per_worker
        if not self._slot_caps_later or (sequences <= self.slots and widest <= per_worker):
            return None
        started = self.inputs.started
        self.inputs = replace(self.inputs, started=replace(started, layouts=tuple(
            replace(lay, slot_cap=cap) for lay, cap in zip(started.layouts, self._slot_caps_later))))
        self._slot_caps_later = ()
        before = self.slots
        plans = self._plans(self.n_ctx_seq)
        if sum(lay.workers * lay.slots for lay, _ in plans) <= before:
            return None
        why = (f"calls hold {sequences} sequences, more than the pool's {counted(before, 'slot')}"
               if sequences > before else
               f"a question's {widest} samples decode together, more than a worker's {counted(per_worker, 'slot')}")
        engines = self._replanned(plans)
        log.info("%s: it grows to %d (each worker builds its context again in place once it has answered what it "
                 "holds)", why, self.slots)
        return engines

    def _replanned(self, plans: list[tuple[Layout, MemoryPlan]]) -> dict[int, EngineConfig]:
        """The plan, settled again (each node's layout and memory plan); the workers' engines for it."""
        for _, memory in plans:
            if memory.note:
                log.warning("memory plan: %s (%s)", memory.note, describe(memory))
        self.plan = replace(self.plan, layouts=tuple(lay for lay, _ in plans))
        self.memory = [memory for _, memory in plans]
        return self.engines()

    def _plans(self, n_ctx_seq: int) -> list[tuple[Layout, MemoryPlan]]:
        """Each node's layout and memory plan at this context per sequence."""
        i = self.inputs
        return [layouts.settled(lay, facts, n_ctx_seq, slots=i.slots, n_batch=i.n_batch, available=available,
                                offload=i.offload, cores=node.cores, gpus=node.gpus)
                for node, lay, facts, available in zip(i.started.nodes, i.started.layouts, i.facts, i.available)]

    def _largest_fitting(self, want: int) -> int:
        """The largest context per sequence up to `want` whose plan fits every node (the plan
        now fits: the answer is never below it). Memory grows with the context: bisect."""
        low, high = self.n_ctx_seq, want
        while low < high:
            mid = (low + high + 1) // 2
            if all(memory.fits for _, memory in self._plans(mid)):
                low = mid
            else:
                high = mid - 1
        return low


def context_needed(questions: Sequence[Question], generation: GenerationParams, n_ctx_train: int) -> int:
    """The context per sequence these questions need: each its prompt (its longest continuation
    included) and the tokens it may generate, sized and capped as the plan sizes it."""
    return max((layouts.context_per_sequence(prompt_length(q), answer_tokens(q, generation), n_ctx_train, None)
                for q in questions), default=0)
