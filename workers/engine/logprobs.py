"""Token log-probabilities from logits rows, and which of them belong to an answer. Pure: numpy
arrays in, numbers out (workers/llama/sampling.py hands over llama.cpp's rows).

A token's log-probability is the log-softmax of the raw logits over the whole vocabulary, before
temperature, top-k/top-p, penalties, logit_bias or a grammar's mask: the model's own
distribution, as OpenAI and llama-server report it, so the numbers do not change with the
sampling settings that picked the token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import numpy as np

# Digits kept of each log-probability: far below any difference a reader acts on, and the
# journal and the answers file stay short.
DIGITS = 6
# Logits within NEAR nats of the highest are the first candidates for the top k; more than
# MAX_CANDIDATES of them and sorting them costs more than a partition of the whole row.
NEAR = 4.0
MAX_CANDIDATES = 1024


def row_logprobs(row: "np.ndarray", token: int, k: int,
                 scratch: "np.ndarray") -> tuple[float, list[tuple[int, float]]]:
    """The picked token's log-probability in one logits row, and the k most likely (token,
    log-probability), most likely first, a tie to the lower id. `scratch`: a float32 buffer of the
    row's length, overwritten (no allocation per row: a row of a 150k vocabulary is 600 KB).

    The exp over the whole vocabulary is the cost (the normaliser needs every term). The top k
    are looked for among the logits near the highest; where those are too many (a flat row: a
    random or very unsure model puts most of the vocabulary within a few nats of the top) or
    too few, a partition of the whole row finds the k-th largest, and every logit at least as
    large is a candidate, so that ties still go to the lower id."""
    import numpy as np

    top = row.max()
    shifted = np.subtract(row, top, out=scratch)
    best: list[tuple[int, float]] = []
    if k > 0:
        ids = np.flatnonzero(shifted >= -NEAR)
        if not min(k, len(row)) <= len(ids) <= MAX_CANDIDATES:
            n = len(row) - min(k, len(row))
            ids = np.flatnonzero(shifted >= np.partition(shifted, n)[n])
        values = shifted[ids]
        best = [(int(ids[j]), float(values[j])) for j in np.lexsort((ids, -values))[:k]]
    chosen = float(shifted[token])
    log_z = float(np.log(np.exp(shifted, out=shifted).sum()))
    return (round(chosen - log_z, DIGITS),
            [(t, round(v - log_z, DIGITS)) for t, v in best])


def log_normalizers(logits: "np.ndarray") -> tuple["np.ndarray", "np.ndarray"]:
    """Each row's highest logit and log-sum-exp, the log-softmax's normaliser (float64: a 150k
    vocabulary summed in float32 loses the last digits)."""
    import numpy as np

    rows = logits.astype(np.float64)
    top = rows.max(axis=1)
    return top, top + np.log(np.exp(rows - top[:, None]).sum(axis=1))


def answer_tokens(pieces: Sequence[bytes], n_chars: int) -> int:
    """How many of the generated tokens (their pieces, in order) the answer holds when its text
    was cut to n_chars characters (a stop string begins there): the tokens that start before the
    cut. The text is decoded as the answer's (UTF-8, bad bytes replaced)."""
    raw = bytearray()
    for i, piece in enumerate(pieces):
        if len(raw.decode("utf-8", errors="replace")) >= n_chars:
            return i
        raw += piece
    return len(pieces)
