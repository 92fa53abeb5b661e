"""Where a new sequence's KV comes from, in llama.cpp's cells: the copies and removals that put an
admitted sequence's first prompt tokens into its slot, move a busy slot's stream, and keep or free
a finished one's.

Without the prefix cache a new sequence starts from the shared prefix's sequence (decoded once
when the engine starts) as far as its prompt agrees with it. With the prefix cache (one stream
per sequence) it starts from whichever stream the scheduler found holding the longest part of its
prompt, and a finished sequence's slot keeps its prompt's cells for the questions that share them.
Which source and how many tokens is workers/engine/prefix_cache.py's decision (pure bookkeeping); this
module carries it out on the model's KV and counts it. Every removal is checked: one llama.cpp
refuses raises KvRefused, since the next decode would start from a state other than the one the
scheduler counts. On recurrent and hybrid memory (workers/engine/memory_kind.py) there is no prefix
cache and a sequence takes the shared prefix only whole, so nothing here asks for a partial cut.
"""

from __future__ import annotations

from array import array
from typing import Optional

from ..engine.memory_kind import KvRefused, MemoryKind
from ..engine.prefix_cache import SlotContents
from ..engine.sequence import Sequence
from ..engine.step_counters import StepCounters
from ..protocol import EngineConfig
from .model_runner import ModelRunner


def slot_contents(config: EngineConfig, prefix: array[int], prefix_id: int,
                  memory: MemoryKind) -> Optional[SlotContents]:
    """The prefix cache's bookkeeping when the job asks for it and the model's memory allows it,
    else None. It needs a stream per sequence: a free slot's kept cells then take no room from
    the others, and a copy between streams is whole (prefix_cache.py); and memory that can be cut
    after any position (memory_kind.py)."""
    if config.prefix_cache and not config.kv_unified and memory.prefix_cache:
        return SlotContents(prefix, prefix_id, config.batch_invariant)
    return None


class SlotKv:
    """The KV streams of an engine's slots: filled from a source on admission, moved, kept, freed."""

    def __init__(self, runner: ModelRunner, prefix: array[int], prefix_id: int,
                 contents: Optional[SlotContents], counters: StepCounters) -> None:
        self.runner = runner
        self.prefix = prefix
        self.prefix_id = prefix_id
        self.contents = contents  # None: no prefix cache, sequences start from the shared prefix
        self.counters = counters

    def start(self, seq: Sequence) -> None:
        """Put the admitted sequence's first n_cached prompt tokens into its slot: copied from
        where the scheduler found them, or kept from the slot's last prompt."""
        self.counters.prompt_reused += seq.n_cached
        if self.contents is None:
            if seq.n_cached:
                self._copy_prefix(seq)
            return
        if seq.source not in (-1, seq.seq_id):
            self.runner.seq_cp(seq.source, seq.seq_id, -1, -1)  # a whole stream: see _copy_prefix
            self.counters.stream_copies += 1
        self.remove(seq.seq_id, seq.n_cached)  # whatever else the slot held
        if seq.source not in (-1, self.prefix_id):
            self.counters.prefix_hits += 1

    def fork(self, parent: int, slot: int, sample: bool = True) -> None:
        """A slot a question's parent sequence held gets a copy of its KV: a sample's whole prompt
        (workers/engine/samples.py), or a scored continuation's context but its last token
        (workers/engine/loglik.py). Whatever the slot held goes first (a copy into a unified pool
        adds cells to what the sequence has), then the whole sequence is copied, as _copy_prefix
        (a partial range aborts between streams; on recurrent memory only the whole state can be
        copied)."""
        self.remove(slot)
        self.runner.seq_cp(parent, slot, -1, -1)
        self._forget(slot)
        if sample:
            self.counters.sample_forks += 1
        else:
            self.counters.stream_copies += 1

    def move(self, seq: Sequence, old_id: int) -> None:
        """A busy sequence moved down to a lower slot (Scheduler.compact): a whole-stream copy (a
        few MiB, done at the next decode) instead of a second pass over the weights in every step
        that remains."""
        self.runner.seq_cp(old_id, seq.seq_id, -1, -1)
        self.remove(old_id)
        self._forget(seq.seq_id, old_id)
        self.counters.moves += 1

    def drop(self, slot: int) -> None:
        """The slot's stream emptied (its sequence preempted): nothing in it is kept."""
        self.remove(slot)
        self._forget(slot)

    def finished(self, seq: Sequence) -> None:
        """A finished sequence's KV given back, or with the prefix cache its prompt's cells kept
        for the questions that share them."""
        if self.contents is None:
            self.remove(seq.seq_id)
            return
        self.contents.keep(seq.seq_id, seq.prompt, seq.n_cached)  # all of it, unless it failed early
        self.counters.kept_tokens_peak = max(self.counters.kept_tokens_peak, self.contents.kept_tokens)

    def clear_kept(self, slots: list[int]) -> None:
        """Empty these free slots' kept prompts (ballast starts at position 0 in an empty stream)."""
        if self.contents:
            for slot in slots:
                if slot in self.contents.kept:
                    self.remove(slot)
                    self.contents.forget(slot)

    def remove(self, slot: int, p0: int = -1) -> None:
        """Remove the slot's positions from p0 on (-1: all of them), or raise KvRefused."""
        if not self.runner.seq_rm(slot, p0, -1):
            where = f"positions {p0} and after" if p0 > 0 else "all positions"
            raise KvRefused(f"llama.cpp refused to remove {where} of sequence {slot} "
                            f"({self.runner.memory_kind.value} memory)")

    def _forget(self, *slots: int) -> None:
        if self.contents:
            for slot in slots:
                self.contents.forget(slot)

    def _copy_prefix(self, seq: Sequence) -> None:
        # Copy the whole prefix sequence: without kv_unified llama.cpp can only copy a full
        # stream (a partial range aborts the process), and with it a full copy just tags cells.
        self.runner.seq_cp(self.prefix_id, seq.seq_id, -1, -1)
        if seq.n_cached < len(self.prefix):
            self.remove(seq.seq_id, seq.n_cached)
