"""Which tokens go into the next llama_decode. Pure bookkeeping: no llama.cpp objects here.

Every step feeds one token for each decoding sequence, then fills the rest of the token budget
with prompt chunks of admitted sequences in admission order (chunked prefill: a long prompt takes
several steps and never stalls the decoding ones). A finished sequence frees its slot at once and
the next waiting question takes it in the following step, so the batch does not decay.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

from workers.sequence import Phase, Sequence, shared_prefix_len


def kv_cells(slots: int, n_ctx_seq: int, n_prefix: int, unified: bool) -> int:
    """KV cells (llama.cpp n_ctx) for `slots` sequences of up to n_ctx_seq tokens sharing
    n_prefix tokens, plus the prefix sequence. Unified: one pool where the prefix is stored once.
    Not unified: llama.cpp splits n_ctx evenly into one stream per sequence."""
    if unified:
        return n_prefix + slots * max(1, n_ctx_seq - n_prefix)
    return (slots + 1) * n_ctx_seq


@dataclass(frozen=True)
class Span:
    """A run of consecutive tokens of one sequence in the batch."""

    seq: Sequence
    start_pos: int
    n: int
    wants_logits: bool  # only the last token of a finished prompt, or a decode token


class Scheduler:
    def __init__(self, slots: int, n_batch: int, prefix: array | None = None,
                 kv_budget: int | None = None, max_new_tokens: int = 0, mix_prefill: bool = True) -> None:
        """kv_budget: KV cells the sequences may fill beyond the shared prefix (None = each slot
        has its own room). A sequence is admitted only when its prompt plus max_new_tokens fits
        what the running ones may still claim, so a full pool never thrashes."""
        if slots > n_batch:
            raise ValueError(f"slots ({slots}) cannot exceed the token budget n_batch ({n_batch})")
        self.n_batch = n_batch
        self.prefix = prefix if prefix is not None else array("i")
        self.kv_budget = kv_budget
        self.max_new_tokens = max_new_tokens
        self.kv_reserved = 0
        self.mix_prefill = mix_prefill  # False: a step holds prompt chunks or decode tokens, not both
        self.free_ids: list[int] = list(range(slots - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order

    @property
    def n_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into free slots. Each starts with as much of the shared prefix
        as it shares (`n_cached`); the caller copies that much KV into its slot."""
        admitted = []
        while self.free_ids and self.waiting:
            seq = self.waiting[0]
            shared = shared_prefix_len(seq.prompt, self.prefix)
            need = seq.n_prompt - shared + self.max_new_tokens
            if self.kv_budget is not None and self.running and self.kv_reserved + need > self.kv_budget:
                break  # wait for a running sequence to finish and give its cells back
            self.waiting.popleft()
            seq.admit(self.free_ids.pop(), shared)
            seq.kv_reserved = need
            self.kv_reserved += need
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def schedule(self, budget: int | None = None) -> list[Span]:
        """The spans of the next batch, within `budget` tokens (default n_batch)."""
        budget = self.n_batch if budget is None else budget
        prefilling = any(s.phase is Phase.PREFILL for s in self.running)
        decoding = [s for s in self.running if s.phase is Phase.DECODE][:budget]
        if prefilling and not self.mix_prefill:
            decoding = []  # prompts first; decoding resumes when they are all in
        spans = [Span(s, s.next_pos, 1, True) for s in decoding]
        budget -= len(spans)
        for seq in self.running:
            if budget <= 0:
                break
            if seq.phase is Phase.PREFILL:
                n = min(seq.n_prompt - seq.n_cached, budget)
                spans.append(Span(seq, seq.n_cached, n, seq.n_cached + n == seq.n_prompt))
                budget -= n
        return spans

    def release(self, seq: Sequence) -> None:
        """Give the slot back (finished or preempted)."""
        self.running.remove(seq)
        self.free_ids.append(seq.seq_id)
        self.kv_reserved -= seq.kv_reserved
        seq.kv_reserved = 0

    def preempt_newest(self) -> Sequence:
        """Take the most recently admitted sequence out to make KV room; it goes back to the
        front of the queue and starts over later."""
        seq = self.running[-1]
        self.release(seq)
        seq.reset_to_waiting()
        self.waiting.appendleft(seq)
        return seq
