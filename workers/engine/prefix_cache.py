"""Where a new sequence's prompt can start: the KV that the worker's streams already hold.

With one KV stream per sequence, a finished question's slot keeps its prompt's cells until the
slot is taken again. A question about to be admitted starts from the longest prefix it shares
with any prompt the worker holds: the shared prefix's sequence, a running sequence's prompt (as
far as it has gone in), or a free slot's kept prompt. Taken from its own slot this costs nothing
(the cells past the shared part are removed); from another stream llama.cpp copies the whole
stream (it cannot copy part of one), a memory copy some hundred times cheaper than computing
the prompt again. The coordinator sends the questions that share a passage together (runner/
prefix_groups.py), so the prompts a worker holds are mostly the ones its next questions share.

A question that shares more with a prompt still going in than with anything held waits for it
(`wanted_soon`): the passage is then computed once per worker, not once per slot that happens to
start a question on it in the same step.

Pure bookkeeping on token arrays: no llama.cpp here (workers/llama/slot_kv.py copies and removes the cells).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable, Optional, TypeAlias

from . import invariant
from .sequence import Phase, Sequence, common_prefix_len

# A question waits for a prompt still going in only when that saves this many tokens or more:
# fewer are cheaper to compute than a slot left idle for a step.
MIN_WAIT_GAIN = 32


@dataclass(frozen=True)
class Start:
    """Where an admitted sequence's KV comes from: `n` prompt tokens out of sequence `source`'s
    stream (-1 and 0: none, the prompt is computed from its first token)."""

    source: int
    n: int


def start_len(common: int, n_prompt: int, n_held: int, batch_invariant: bool) -> int:
    """Of `common` tokens agreeing with n_held tokens in KV, how many a prompt of n_prompt may
    take: at least one is left to compute (its logits are needed); batch-invariant, as
    invariant.shared_len says."""
    if batch_invariant:
        return invariant.shared_len(common, n_prompt, n_held)
    return min(common, n_prompt - 1)


# A waiting prompt's common prefix lengths with token arrays held in KV, by the array's id, the
# array kept beside its length so that the id cannot be another array's while it is remembered.
Known: TypeAlias = "dict[int, tuple[array[int], int]]"  # a string: array takes [int] at run time from 3.12


def shared_len(prompt: array[int], held: array[int], known: Optional[Known]) -> int:
    """common_prefix_len(prompt, held), remembered in `known` (Sequence.known_prefixes): a
    question waiting through many steps is compared with the same held prompts at each admission,
    and with a hundred prompts held those comparisons were most of a step's own work."""
    if known is None:
        return common_prefix_len(prompt, held)
    seen = known.get(id(held))
    if seen is not None and seen[0] is held:
        return seen[1]
    n = common_prefix_len(prompt, held)
    known[id(held)] = (held, n)
    return n


class SlotContents:
    """What each KV stream holds of which prompt, and the best start for a new prompt."""

    def __init__(self, prefix: array[int], prefix_id: int, batch_invariant: bool) -> None:
        self.prefix = prefix
        self.prefix_id = prefix_id
        self.batch_invariant = batch_invariant
        self.kept: dict[int, array[int]] = {}  # free slot -> the prompt tokens its stream holds

    def keep(self, slot: int, prompt: array[int], n: int) -> None:
        """A sequence finished in `slot`: the cells of its prompt's first n tokens (what went in)
        stay there until the slot is taken."""
        if n:
            self.kept[slot] = prompt[:n]

    def forget(self, slot: int) -> None:
        """The slot's stream was emptied or taken (admission, a move, ballast, preemption)."""
        self.kept.pop(slot, None)

    @property
    def kept_tokens(self) -> int:
        return sum(len(t) for t in self.kept.values())

    def start(self, prompt: array[int], slot: int, running: Iterable[Sequence], known: Optional[Known] = None) -> Start:
        """The longest usable prefix for `prompt` about to go into `slot`; its own slot's kept
        cells win a tie (no copy). `known`: the prompt's common prefixes found so far (shared_len)."""
        best = Start(-1, 0)
        for source, held, n_held in self._held(running):
            common = min(shared_len(prompt, held, known), n_held)
            n = start_len(common, len(prompt), n_held, self.batch_invariant)
            if n > best.n or (n == best.n and n > 0 and source == slot):
                best = Start(source, n)
        return best

    def wanted_kept(self, waiting: Iterable[Sequence], running: list[Sequence]) -> dict[int, int]:
        """Free slot -> how many waiting questions start best from the prompt it keeps: a slot a
        question takes is emptied, so a question goes to a slot no other one wants when it can
        (several continuations of one context, or questions on one passage, each start from it)."""
        wanted: dict[int, int] = {}
        for seq in waiting:
            start = self.start(seq.context, -1, running, seq.known_prefixes)
            if start.source in self.kept:
                wanted[start.source] = wanted.get(start.source, 0) + 1
        return wanted

    def wanted_soon(self, prompt: array[int], running: Iterable[Sequence], known: Optional[Known] = None) -> int:
        """Tokens of `prompt` that a running sequence's prompt, still going in, will offer."""
        best = 0
        for seq in running:
            if seq.phase is Phase.PREFILL:
                n = start_len(shared_len(prompt, seq.prompt, known), len(prompt), seq.n_prompt,
                              self.batch_invariant)
                if n > seq.n_cached:
                    best = max(best, n)
        return best

    def _held(self, running: Iterable[Sequence]) -> Iterable[tuple[int, array[int], int]]:
        """(sequence id, tokens, how many of them are in its KV) for every stream holding some."""
        if len(self.prefix):
            yield self.prefix_id, self.prefix, len(self.prefix)
        for slot, tokens in self.kept.items():
            yield slot, tokens, len(tokens)
        for seq in running:
            if seq.n_cached:
                yield seq.seq_id, seq.prompt, seq.n_cached
