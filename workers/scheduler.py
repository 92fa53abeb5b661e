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


@dataclass(frozen=True)
class Span:
    """A run of consecutive tokens of one sequence in the batch."""

    seq: Sequence
    start_pos: int
    n: int
    wants_logits: bool  # only the last token of a finished prompt, or a decode token


class Scheduler:
    def __init__(self, slots: int, n_batch: int, prefix: array | None = None) -> None:
        if slots > n_batch:
            raise ValueError(f"slots ({slots}) cannot exceed the token budget n_batch ({n_batch})")
        self.n_batch = n_batch
        self.prefix = prefix if prefix is not None else array("i")
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
            seq = self.waiting.popleft()
            seq.admit(self.free_ids.pop(), shared_prefix_len(seq.prompt, self.prefix))
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def schedule(self, budget: int | None = None) -> list[Span]:
        """The spans of the next batch, within `budget` tokens (default n_batch)."""
        budget = self.n_batch if budget is None else budget
        decoding = [s for s in self.running if s.phase is Phase.DECODE][:budget]
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

    def preempt_newest(self) -> Sequence:
        """Take the most recently admitted sequence out to make KV room; it goes back to the
        front of the queue and starts over later."""
        seq = self.running[-1]
        self.release(seq)
        seq.reset_to_waiting()
        self.waiting.appendleft(seq)
        return seq
