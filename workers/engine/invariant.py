"""Batch-invariant mode: the batch shapes under which llama.cpp computes a row the same whatever
else is in the batch. Pure functions over token counts and batch arrays; no llama.cpp here.

Which kernel ggml's CPU backend runs for a matrix product depends on n, the number of columns of
its second operand (tokens in the ubatch for the weights; tokens of one sequence in the ubatch for
attention; rows whose logits are asked for, for the output layer and the last layer's feed-forward,
which llama.cpp runs after `ggml_get_rows(inp_out_ids)`). The kernels add up each dot product in
different orders, so a row's result changes with n at the switch (all verified bit for bit on this
build, llama-cpp-python 0.3.36):
  - F32, F16, Q8_0, Q4_0 weights and attention (F16 KV): llamafile_sgemm (sgemm.cpp) returns
    false when n < 2 ("only enable sgemm for prompt processing"), so n = 1 takes ggml's vec_dot
    path; for n >= 2 tinyBLAS computes each element as one madd chain over k then hsum, whatever
    n and the tile shape.
  - K-quant and IQ weights (Q4_K_M files: Q4_K, Q6_K): ggml_compute_forward_mul_mat_tiled
    (tiled/tiled.cpp) runs only from ggml_tiled_min_batch = 8 columns; below, vec_dot again.
    Its narrow (n <= 16) and standard paths give the same bits for every n >= 8.
  - Repacked weights (CPU_REPACK, repack.cpp forward_mul_mat_one_chunk) use gemm for each group
    of 4 columns and gemv for the rest, which round differently: a row's result then depends on
    its index and n. Batch-invariant mode does not repack.
So every llama_decode here keeps each row on one side of every switch, or in the same shape
every time:
  - a decode step holds at least MIN_ROWS tokens, all asking for logits: with fewer sequences
    decoding, "ballast" tokens fill it up, one in each free sequence id above theirs (position
    0 of an empty stream, logits never read, removed after the step). Attention is per
    sequence, one token: n = 1 always;
  - a prompt is fed alone, in chunks of at least MIN_ROWS tokens (so attention has n >= 2 and
    the weights n >= MIN_ROWS, however the prompt is cut), its last chunk asking for exactly
    one logits row, which is always that shape; a prompt shorter than MIN_ROWS is fed whole
    and alone, which is also always the same shape;
  - the shared prefix counts as a prompt of its own: shared only if at least MIN_ROWS tokens,
    and a sequence keeps at least MIN_ROWS prompt tokens of its own, so the tokens it computes
    itself take the same kernels with and without the prefix.
Everything else a row goes through is row-wise (norms, rope, softmax, element-wise ops), and its
attention sees its own KV stream's cells at the same indices (a cleared stream restarts at cell
0), the cells past its own masked to exact zeros.

These are the kernels of x86 CPUs (AVX2, AVX-512). Elsewhere llama.cpp picks by other rules that
MIN_ROWS alone does not cover: on ARM with i8mm, vec_dot multiplies two columns at once for
Q4_0, Q8_0, Q4_K and Q6_K weights when the column count is even (ggml-cpu.c type_traits_cpu
nrows = 2), so a row's result there depends on the batch's parity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Sequence as Seq

if TYPE_CHECKING:
    import numpy as np

# numpy is imported inside the functions that build batch arrays: the coordinator imports this
# module (kv_streams, through the scheduler's kv_cells) and starts 0.5 s sooner without numpy.

# Columns from which every matrix product takes its batched kernel (see the module doc).
MIN_ROWS = 8


def kv_streams(slots: int, invariant: bool) -> int:
    """KV streams (llama.cpp n_seq_max) with one stream per sequence: the slots and the shared
    prefix; in batch-invariant mode at least MIN_ROWS sequence ids below the prefix, so a decode
    step of fewer sequences has free ids for its ballast."""
    return (max(slots, MIN_ROWS) if invariant else slots) + 1


def step_budget(n_batch: int, slots: int, invariant: bool) -> int:
    """Tokens per decode step, also llama.cpp's n_ubatch: n_batch, raised to one for each sequence
    the context holds (kv_streams, the shared prefix's too). llama.cpp sizes a step's output rows by
    n_ubatch, and a context with more sequences than that aborts while it is built
    (GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max)). In batch-invariant mode at least
    2 MIN_ROWS: prompt chunks are MIN_ROWS tokens or more and leave MIN_ROWS or none (chunk_len)."""
    floor = max(kv_streams(slots, invariant), 2 * MIN_ROWS if invariant else 0)
    return max(n_batch, floor)


def prefix_seq_id(slots: int, invariant: bool) -> int:
    """The sequence id that holds the shared prefix: the last of the kv_streams, after the slots
    (and in batch-invariant mode the ballast ids)."""
    return kv_streams(slots, invariant) - 1


def shared_len(common: int, n_prompt: int, n_prefix: int) -> int:
    """Prompt tokens a sequence takes from the shared prefix (`common` of them agree with it):
    at least MIN_ROWS are left to the sequence, a prompt shorter than MIN_ROWS takes none, and a
    prefix shorter than MIN_ROWS is not shared at all."""
    if n_prefix < MIN_ROWS or n_prompt < MIN_ROWS:
        return 0
    return max(0, min(common, n_prompt - MIN_ROWS))


def chunk_len(remaining: int, budget: int) -> int:
    """Tokens of the next chunk of a prompt with `remaining` tokens left: all of them if they fit,
    else as many as fit while leaving MIN_ROWS or more for the next chunk (budget >= 2 MIN_ROWS)."""
    if remaining <= budget:
        return remaining
    if remaining - budget >= MIN_ROWS:
        return budget
    return remaining - MIN_ROWS


def scored_chunk(start: int, n: int, scored_from: int, end: int, budget: int) -> int:
    """The next chunk of a scored prompt (chunk_len gave `n` tokens from `start`; its scored rows
    run from `scored_from` to `end`): one that would end among the scored rows ends where they
    begin instead, so that their logits come from one chunk, in one product of the output layer,
    wherever a shared prefix made the chunks start (a product of one row runs another kernel than
    one of nine). Only where both chunks keep MIN_ROWS or more and the scored rows fit the budget."""
    if scored_from < start + n < end and scored_from - start >= MIN_ROWS and end - scored_from <= budget:
        return scored_from - start
    return n


def ballast_ids(seq_ids: np.ndarray, limit: int) -> list[int]:
    """Sequence ids for ballast tokens that bring a decode batch (one token per sequence, ids in
    increasing order) to MIN_ROWS tokens. llama.cpp keeps a batch in one ubatch only when its
    sequence ids are consecutive (llama_batch_allocr::split_equal, sequential), so the ballast
    takes the ids right after the batch's; they must be below `limit` (the prefix's id)."""
    n = len(seq_ids)
    if n >= MIN_ROWS or n == 0:
        return []
    first = int(seq_ids[0])
    if list(seq_ids) != list(range(first, first + n)):
        raise ValueError(f"decode batch sequence ids are not consecutive: {list(seq_ids)}")
    ids = list(range(first + n, first + MIN_ROWS))
    if ids[-1] >= limit:
        raise ValueError(f"no free sequence id for ballast above {first + n - 1} (limit {limit})")
    return ids


def lay_out(arrays: tuple[np.ndarray, ...], limit: int) -> tuple[tuple[np.ndarray, ...], list[int]]:
    """(tokens, positions, sequence ids, logits flags) of a scheduled batch made batch-invariant:
    a batch of one token per sequence (a decode step) gets ballast up to MIN_ROWS tokens, each
    at position 0 of its own empty stream and asking for logits (which nobody reads). A prompt
    chunk is left as it is. Returns the arrays and the ballast ids."""
    import numpy as np

    tokens, pos, seq_ids, logits = arrays
    ballast = ballast_ids(seq_ids, limit) if len(set(seq_ids.tolist())) == len(seq_ids) else []
    if ballast:
        n = len(ballast)
        tokens = np.concatenate([tokens, np.full(n, tokens[0], np.int32)])  # any valid token
        pos = np.concatenate([pos, np.zeros(n, np.int32)])
        seq_ids = np.concatenate([seq_ids, np.array(ballast, np.int32)])
        logits = np.concatenate([logits, np.ones(n, np.int8)])
    return (tokens, pos, seq_ids, logits), ballast


def output_rows(logits: np.ndarray, batch_index: Seq[int]) -> list[int]:
    """Row of llama_get_logits holding the logits of each batch index (rows are stored in batch
    order for the tokens that asked for logits)."""
    import numpy as np

    before = np.cumsum(logits != 0)
    return [int(before[i]) - 1 for i in batch_index]
