"""How a step's prompt chunks are cut and listed so llama.cpp makes few, large ubatches of them.

With one KV stream per sequence llama.cpp cuts a batch into ubatches (each one pass over the
weights) with llama_batch_allocr::split_equal: starting at the first unused token, it chains the
sequences whose ids follow one another (id + 1, in batch order) and takes the same number of
tokens from each, the fewest any of them has left. Prompt chunks of different lengths listed by
id therefore fall apart into many thin ubatches (chunks of 38, 159, 109, 76, 47 and 83 tokens:
six ubatches of 38, 9, 29, 33, 50 and 36 tokens a sequence). A thin one costs twice: a pass over
the weights of its own, and ggml's CPU flash attention runs its tiled kernel only for 64 or more
query rows a sequence (GGML_FA_TILE_Q), one query at a time below that, which at positions
500-700 (a question's own part after a shared passage) is most of the cost.

So prompt steps are laid out as: each run of consecutive ids with equal chunk lengths (a
rectangle: one ubatch), runs listed from the highest ids down so that no run chains into the
next; and a chunk that does not finish its prompt is MIN_CHUNK tokens or more and leaves
MIN_CHUNK or more behind. Measured on the benchmark model, one thread (CPU seconds, 512 prompt
tokens at position 560 over six sequences): listed by id 5.0 s, one ubatch a sequence 3.8 s, one
rectangle (6 × 85) 3.5 s.

Pure: spans in, spans out.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from .sequence import Sequence

# ggml's CPU flash attention takes its tiled path from this many query rows of one sequence in
# a ubatch (GGML_FA_TILE_Q in ggml-cpu/common.h).
MIN_CHUNK = 64


class Chunk(Protocol):
    """What is laid out: a run of one sequence's tokens (scheduler.Span)."""

    @property
    def seq(self) -> Sequence: ...

    @property
    def n(self) -> int: ...


C = TypeVar("C", bound=Chunk)


def chunk_len(left: int, budget: int, min_chunk: int = MIN_CHUNK) -> int:
    """Tokens of a prompt with `left` still to go that a step with `budget` tokens free takes:
    all of them when they fit; otherwise as many as fit but leaving `min_chunk` or more behind,
    and none when that is fewer than `min_chunk` (a thin chunk costs a pass of its own; the next
    step takes more)."""
    if left <= budget:
        return left
    n = min(budget, left - min_chunk)
    return n if n >= min_chunk else 0


def ubatch_order(spans: list[C]) -> list[C]:
    """The spans listed so that split_equal makes one ubatch of each run of consecutive sequence
    ids with equal lengths: ids ascending within a run, runs from the highest ids down (a run's
    last id + 1 is then used up when the run below it is cut, so the chain stops there)."""
    runs: list[list[C]] = []
    for span in sorted(spans, key=lambda s: s.seq.seq_id):
        last = runs[-1][-1] if runs else None
        if last is not None and last.seq.seq_id + 1 == span.seq.seq_id and last.n == span.n:
            runs[-1].append(span)
        else:
            runs.append([span])
    return [span for run in reversed(runs) for span in run]


def passes(spans: list[C], n_ubatch: int) -> list[tuple[int, int]]:
    """(sequences, tokens of each) of every ubatch split_equal cuts the spans into, listed as
    given, each chunk of one sequence: what a layout costs, for tests and benchmarks."""
    left = {s.seq.seq_id: s.n for s in spans}
    order = [s.seq.seq_id for s in spans]
    out = []
    while any(left.values()):
        chain = [next(i for i in order if left[i])]
        for i in order:
            if i == chain[-1] + 1 and left[i]:
                chain.append(i)
        n = min(min(left[i] for i in chain), max(1, n_ubatch // len(chain)))
        for i in chain:
            left[i] -= n
        out.append((len(chain), n))
    return out
