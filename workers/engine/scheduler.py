"""Which tokens go into the next llama_decode. Pure bookkeeping: no llama.cpp objects here.

Every step feeds one token for each decoding sequence, then fills the rest of the token budget
with prompt chunks of admitted sequences in admission order (chunked prefill: a long prompt takes
several steps and never stalls the decoding ones). A finished sequence frees its slot at once and
the next waiting question takes it in the following step, so the batch does not decay.

With one KV stream per sequence, llama.cpp cuts a batch into ubatches (one pass over the weights
each) of sequences with consecutive ids, in batch order (llama_batch_allocr::split_equal,
"sequential"), and each ubatch takes the same number of tokens from every sequence in it. So
there: a step holds prompt chunks or decode tokens, not both; every batch lists its sequences
by id; a free slot is always the lowest free id; and when a slot below the highest busy one stays
free (no question waiting to fill it), the highest sequence moves down into it (`compact`).
Measured on the 28 × 1024 model, 32 sequences decoding: 107 ms a step with ids 0..31 in order,
141-156 ms with one id out of place, 330-410 ms shuffled or reversed.
With the prefix cache a prompt step is mostly short own parts of several questions after a
shared passage: those chunks are cut and listed as workers/engine/ubatches.py says (one ubatch per
sequence, or per run of equal chunks), not by id.

Batch-invariant mode (workers/engine/invariant.py) schedules a step as either one prompt chunk alone
(at least MIN_ROWS tokens, or a whole short prompt) or one token of every running sequence,
never shrinks a batch, and leaves every sequence at least MIN_ROWS prompt tokens of its own.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Optional

from . import invariant, ubatches
from .memory_kind import MemoryKind
from .prefix_cache import MIN_WAIT_GAIN, SlotContents, Start, start_len
from .sequence import Phase, Sequence, common_prefix_len


@dataclass(frozen=True)
class Span:
    """A run of consecutive tokens of one sequence in the batch."""

    seq: Sequence
    start_pos: int
    n: int
    wants_logits: bool  # only the last token of a finished prompt, or a decode token


class Scheduler:
    # Prompt steps laid out for llama.cpp's ubatch split (workers/engine/ubatches.py) when the prefix
    # cache is on, where a step's prompts are many short own parts (False: by id, as without the
    # cache; bench/prefix_engine_bench.py sets it on one scheduler to compare).
    shaped_prefill: bool = True

    def __init__(self, slots: int, n_batch: int, *, prefix: array[int] | None = None,
                 kv_budget: int | None = None, max_new_tokens: int = 0,
                 stream_per_sequence: bool = False, batch_invariant: bool = False,
                 contents: Optional[SlotContents] = None,
                 memory: MemoryKind = MemoryKind.ATTENTION, n_ctx_seq: int | None = None) -> None:
        """kv_budget: KV cells the sequences may fill beyond the shared prefix (None = each slot
        has its own room). A sequence is admitted only when its prompt plus the tokens it may still
        write fits what the running ones may still claim, so a full pool never thrashes.
        n_ctx_seq: a sequence's context, prompt included; it writes no more than the room its
        prompt leaves there, however large max_tokens is (None: max_tokens alone).
        stream_per_sequence: the context keeps one KV stream per sequence (see the module doc).
        batch_invariant: lay batches out as workers/engine/invariant.py requires (needs streams).
        contents: the prefix cache (workers/engine/prefix_cache.py); None: prompts start from the shared
        prefix only. memory: what the model's memory can do; on recurrent state a prompt takes the
        shared prefix whole or not at all (workers/engine/memory_kind.py; there is no prefix cache there)."""
        if slots > n_batch:
            raise ValueError(f"slots ({slots}) cannot exceed the token budget n_batch ({n_batch})")
        self.n_batch = n_batch
        self.prefix = prefix if prefix is not None else array("i")
        self.kv_budget = kv_budget
        self.max_new_tokens = max_new_tokens
        self.n_ctx_seq = n_ctx_seq
        self.kv_reserved = 0
        self.stream_per_sequence = stream_per_sequence or batch_invariant
        self.batch_invariant = batch_invariant
        self.free_ids: list[int] = list(range(slots))  # a heap: admission takes the lowest
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.contents = contents
        self.memory = memory
        self.prefix_id = invariant.prefix_seq_id(slots, batch_invariant)  # where the shared prefix is
        # A scored question's continuations wait together, each a sequence starting from the context
        # the first one leaves in its slot (workers/engine/loglik.py): how many of each question's
        # wait, and which free slot keeps whose context (_wanted).
        # Keyed by the question's loglik.Parent itself (held, so never confused with a later one).
        self.waiting_continuations: dict[object, list[Sequence]] = {}
        self.context_of: dict[int, object] = {}

    @property
    def n_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self._track_waiting(seq, True)

    def _track_waiting(self, seq: Sequence, waits: bool) -> None:
        """A scored sequence joins (waits) or leaves its question's waiting continuations."""
        if seq.scoring is None:
            return
        waiting = self.waiting_continuations.setdefault(seq.scoring.parent, [])
        if waits:
            waiting.append(seq)
        else:
            waiting.remove(seq)
            if not waiting:
                del self.waiting_continuations[seq.scoring.parent]

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into free slots, in order, each with where its KV starts
        (`n_cached` prompt tokens from sequence `source`: the caller copies them into its slot).
        With the prefix cache, a question that a prompt still going in will soon serve better
        lets the next ones go first (prefix_cache.MIN_WAIT_GAIN)."""
        admitted = self._admit_pass(self._wanted())
        if not admitted and not self.running and self.waiting and self.free_ids:
            # Nothing runs that could change what the free slots keep: holding them for the
            # questions that start from them would wait for good if none can take them now.
            admitted = self._admit_pass({})
        return admitted

    def _admit_pass(self, wanted: dict[int, int]) -> list[Sequence]:
        """admit(), the free slots that `wanted` names held for the questions that start from them."""
        admitted: list[Sequence] = []
        i = 0
        while self.free_ids and i < len(self.waiting):
            seq = self.waiting[i]
            slot = self._slot_for(seq, wanted)
            if slot < 0:  # every free slot keeps a prompt that a question behind it starts from
                i += 1
                continue
            start = self._start(seq, slot)
            if (self.contents and self.contents.wanted_soon(seq.context, self.running, seq.known_prefixes)
                    >= start.n + MIN_WAIT_GAIN):
                i += 1
                continue
            if seq.forks and start.n >= seq.fork_at:
                self._unfork(seq, i + 1)
            n_slots = seq.slots_wanted
            if len(self.free_ids) < n_slots:
                break  # a question of several samples waits for a slot for each (kept in order)
            need = seq.n_prompt - start.n + n_slots * self._max_new(seq)
            if self.kv_budget is not None and self.running and self.kv_reserved + need > self.kv_budget:
                break  # wait for a running sequence to finish and give its cells back
            del self.waiting[i]
            self._track_waiting(seq, False)
            seq.known_prefixes.clear()
            self.free_ids.remove(slot)
            heapq.heapify(self.free_ids)
            if start.source in wanted:
                wanted[start.source] -= 1
            seq.admit(slot, start.n, start.source)
            seq.fork_ids = [heapq.heappop(self.free_ids) for _ in range(n_slots - 1)]
            if self.contents:
                for slot in (seq.seq_id, *seq.fork_ids):
                    self.contents.forget(slot)
                    self.context_of.pop(slot, None)
            seq.kv_reserved = need
            self.kv_reserved += need
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _unfork(self, seq: Sequence, at: int) -> None:
        """Its context is held already (another question's, or a kept slot's): its continuations
        wait beside it, each to start from that KV as it does, rather than fork from it."""
        for k, child in enumerate(seq.forks):
            self.waiting.insert(at + k, child)
            self._track_waiting(child, True)
        seq.forks = []

    def _max_new(self, seq: Sequence) -> int:
        """The most tokens it may write: its max_tokens (a question's own, else the job's), within
        the room its context leaves (reserving max_tokens beyond it held slots idle: a long shared
        prefix and a large max_tokens ran one question at a time)."""
        own = seq.question.generation
        most = own.max_tokens if own else self.max_new_tokens
        return most if self.n_ctx_seq is None else max(0, min(most, self.n_ctx_seq - seq.n_prompt))

    def fork(self, parent: Sequence, child: Sequence, slot: int) -> None:
        """A sample's or a continuation's sequence takes a slot its parent held, with the prompt
        tokens the parent has in (the caller copies the KV: a sample's whole prompt, a
        continuation's context but its last token), and its share of the parent's KV reservation."""
        parent.fork_ids.remove(slot)
        child.admit(slot, parent.n_cached)
        child.t_admit = parent.t_admit
        share = self._max_new(parent)
        parent.kv_reserved -= share
        child.kv_reserved = share
        self.running.append(child)

    def _wanted(self) -> dict[int, int]:
        """With the prefix cache: free slot -> waiting questions that start best from what it keeps
        (the first few: those admitted soon; and a scored question's continuations still waiting,
        wherever they are in the queue, for the slot keeping its context: given to another
        question's copy, the context would be computed again)."""
        if not self.contents:
            return {}
        wanted = self.contents.wanted_kept(itertools.islice(self.waiting, 2 * len(self.free_ids)), self.running)
        for slot in self.free_ids:
            waiting = self.waiting_continuations.get(self.context_of.get(slot))
            if waiting and slot not in wanted and slot in self.contents.kept:
                # held only for a continuation that starts from it: one that starts elsewhere (a
                # context of one token, a prefix held as far elsewhere) would never take it
                first = waiting[0]
                if self.contents.start(first.context, -1, self.running, first.known_prefixes).source == slot:
                    wanted[slot] = len(waiting)
        return wanted

    def _slot_for(self, seq: Sequence, wanted: dict[int, int]) -> int:
        """The lowest free slot; with the prefix cache the one whose kept prompt this question
        starts from (its cells used in place), else the lowest whose kept prompt no waiting question
        wants, else -1: the question lets the ones that start from those slots go first."""
        if not wanted:
            return self.free_ids[0]
        assert self.contents is not None
        own = self.contents.start(seq.context, -1, self.running, seq.known_prefixes).source
        if own in self.free_ids:
            return own
        return next((slot for slot in sorted(self.free_ids) if not wanted.get(slot)), -1)

    def _start(self, seq: Sequence, slot: int) -> Start:
        # A scored prompt's context only: the rows of its scored tokens must be computed.
        context = seq.context
        if self.contents:
            return self.contents.start(context, slot, self.running, seq.known_prefixes)
        n = start_len(common_prefix_len(context, self.prefix), len(context), len(self.prefix),
                      self.batch_invariant)
        n = self.memory.start_len(n, len(self.prefix))
        return Start(self.prefix_id if n else -1, n)

    def compact(self) -> list[tuple[Sequence, int]]:
        """With one stream per sequence, keep the busy ids contiguous from 0: while a free id is
        lower than the highest busy one, that sequence takes it. Returns (sequence, old id) for
        each move; the caller moves its KV stream. Called after admit(), so a free id here has
        no waiting question to fill it (the tail of the run), or keeps a prompt that a waiting
        question starts from but cannot take yet (it waits for a slot for each of its samples, or
        for KV room): with the prefix cache that slot stays free, except in batch-invariant mode,
        whose decode step needs the ids 0..k-1 (invariant.ballast_ids), so the sequence moves in
        and the kept prompt is computed again when that question starts."""
        moves: list[tuple[Sequence, int]] = []
        if not self.stream_per_sequence:
            return moves
        wanted = {} if self.batch_invariant else self._wanted()
        while self.free_ids and self.running:
            top = max(self.running, key=_seq_id)
            if self.free_ids[0] > top.seq_id or wanted.get(self.free_ids[0]):
                break  # in order, or the free slot keeps a prompt a waiting question starts from
            old = top.seq_id
            top.seq_id = heapq.heapreplace(self.free_ids, old)
            self.context_of.pop(top.seq_id, None)
            moves.append((top, old))
        return moves

    def schedule(self, budget: int | None = None) -> list[Span]:
        """The spans of the next batch, within `budget` tokens (default n_batch), by sequence id."""
        budget = self.n_batch if budget is None else budget
        if self.batch_invariant:
            return self._schedule_invariant()
        prefilling = any(s.phase is Phase.PREFILL for s in self.running)
        if prefilling and self.stream_per_sequence and self.contents is not None and self.shaped_prefill:
            # A budget too small for any chunk of MIN_CHUNK (a retry after a full KV) takes what fits.
            return ubatches.ubatch_order(self._prompt_chunks(budget, ubatches.MIN_CHUNK)
                                         or self._prompt_chunks(budget))
        decoding = sorted((s for s in self.running if s.phase is Phase.DECODE), key=_seq_id)[:budget]
        if prefilling and self.stream_per_sequence:
            decoding = []  # prompts first; decoding resumes when they are all in
        spans = [Span(s, s.next_pos, 1, True) for s in decoding]
        spans += self._prompt_chunks(budget - len(spans))
        return sorted(spans, key=lambda span: span.seq.seq_id)

    def _prompt_chunks(self, budget: int, min_chunk: int = 1) -> list[Span]:
        """Chunks of the prompts going in, in admission order, within `budget` tokens; with
        min_chunk, as ubatches.chunk_len cuts them."""
        spans = []
        for seq in self.running:
            if budget <= 0:
                break
            if seq.phase is Phase.PREFILL:
                n = ubatches.chunk_len(seq.prefill_end - seq.n_cached, budget, min_chunk)
                if n:
                    spans.append(Span(seq, seq.n_cached, n, seq.n_cached + n == seq.n_prompt))
                    budget -= n
        return spans

    def _schedule_invariant(self) -> list[Span]:
        """One prompt chunk alone (the earliest admitted prompt still going in), else one token of
        every running sequence: their ids are 0..k-1 (admit and compact keep them so), which
        llama.cpp keeps in one ubatch. The batch never shrinks (invariant.ballast_ids needs the
        ids above it free), so `budget` does not apply; n_batch holds every slot's token."""
        for seq in self.running:
            if seq.phase is Phase.PREFILL:
                n = invariant.chunk_len(seq.n_prompt - seq.n_cached, self.n_batch)
                if seq.scoring is not None:
                    n = invariant.scored_chunk(seq.n_cached, n, seq.scored_from, seq.n_prompt, self.n_batch)
                return [Span(seq, seq.n_cached, n, seq.n_cached + n == seq.n_prompt)]
        return [Span(s, s.next_pos, 1, True) for s in sorted(self.running, key=_seq_id)]

    def drop_waiting(self) -> int:
        """Forget the sequences not yet admitted (stopping); returns how many."""
        n = len(self.waiting)
        self.waiting.clear()
        self.waiting_continuations.clear()
        return n

    def release(self, seq: Sequence) -> None:
        """Give the slot back (finished or preempted)."""
        self.running.remove(seq)
        for slot in (seq.seq_id, *seq.fork_ids):  # slots held for samples that never forked go back too
            heapq.heappush(self.free_ids, slot)
        if seq.scoring is not None:
            self.context_of[seq.seq_id] = seq.scoring.parent
        else:
            self.context_of.pop(seq.seq_id, None)
        seq.fork_ids = []
        self.kv_reserved -= seq.kv_reserved
        seq.kv_reserved = 0

    def preempt_newest(self) -> tuple[Sequence, int]:
        """Take the most recently admitted sequence out to make KV room; it goes back to the
        front of the queue and starts over later. Returns it and the slot it held (whose KV the
        caller frees)."""
        seq = self.running[-1]
        slot = seq.seq_id
        self.release(seq)
        seq.reset_to_waiting()
        self.waiting.appendleft(seq)
        self._track_waiting(seq, True)
        return seq, slot


def _seq_id(seq: Sequence) -> int:
    return seq.seq_id
