"""Token log-probabilities from logits rows, and which of them belong to an answer. Pure: numpy
arrays in, numbers out (workers/llama/sampling.py hands over llama.cpp's rows).

A token's log-probability is the log-softmax of the raw logits over the whole vocabulary, before
temperature, top-k/top-p, penalties, logit_bias or a grammar's mask: the model's own
distribution, as OpenAI and llama-server report it, so the numbers do not change with the
sampling settings that picked the token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from .sequence import decode_text

if TYPE_CHECKING:
    import numpy as np

# Digits kept of each log-probability: far below any difference a reader acts on, and the
# journal and the answers file stay short.
DIGITS = 6
# The top k are looked for among the logits within NEAR nats of the highest, the window halved
# while it holds more than MAX_CANDIDATES (sorting more costs more than a partition of the whole
# row). A flat row needs the narrower windows: a random-weight model (the benchmarks') puts nearly
# all of a 151,936-token vocabulary within a nat of the top, and a window (a comparison and a count
# over the row) costs a fiftieth of a partition of it; a trained model's rows mostly hold a few
# within NEAR.
NEAR = 4.0
MAX_CANDIDATES = 1024
NARROWEST = NEAR / 2**16


def row_logprobs(row: "np.ndarray", token: int, k: int,
                 scratch: "np.ndarray") -> tuple[float, list[tuple[int, float]]]:
    """The picked token's log-probability in one logits row, and the k most likely (token,
    log-probability), most likely first, a tie to the lower id: block_logprobs of a block of one
    row. `scratch`: a float32 buffer of the row's length, overwritten."""
    return block_logprobs(row[None, :], [token], k, scratch[None, :])[0]


def block_logprobs(block: "np.ndarray", tokens: Sequence[int], k: int,
                   scratch: "np.ndarray") -> list[tuple[float, list[tuple[int, float]]]]:
    """row_logprobs of each row of `block` (rows × vocabulary), the normaliser's passes over all
    the rows at once. `scratch`: a float32 buffer at least the block's shape, overwritten; it may
    be the block itself (no allocation per row: a row of a 150k vocabulary is 600 KB).

    Whole-block passes matter where threads share the work (workers/llama/sampling.py): numpy lets
    go of the GIL inside a pass and takes it back after, and a thread waits its turn at every
    hand-over, so a few passes a block scale over cores where a dozen a row do not.

    The exp over the whole vocabulary is the cost (the normaliser needs every term). The top k
    are looked for among the logits near the highest (_near_top, a row at a time: a comparison
    and a count, one to five windows a row, together faster on one thread than a block's mask
    counted along its axis); where no window holds a few of them, a partition of the whole row
    finds the k-th largest. Every logit at least as large as the k-th is a candidate either way,
    so that ties still go to the lower id."""
    import numpy as np

    n = len(block)
    shifted = _shifted(block, scratch)
    best: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    if k > 0:
        wanted = min(k, block.shape[1])
        for i in range(n):
            best[i] = _top_k(shifted[i], _near_top(shifted[i], wanted), k)
    chosen = shifted[np.arange(n), list(tokens)].tolist()
    log_z = _log_z(shifted)
    return [(round(c - z, DIGITS), [(t, round(v - z, DIGITS)) for t, v in top])
            for c, z, top in zip(chosen, log_z, best)]


def tokens_logprobs(row: "np.ndarray", tokens: Sequence[int], scratch: "np.ndarray") -> list[float]:
    """The log-probability of each of these tokens at one logits row (unrounded), by the same
    arithmetic as block_logprobs's: a choice read from the logits has the number its token's
    log-probability entry shows. `scratch`: a float32 buffer of at least the row's length."""
    shifted = _shifted(row[None, :], scratch[None, :len(row)])
    values = shifted[0, list(tokens)].tolist()
    z = _log_z(shifted)[0]
    return [v - z for v in values]


def _shifted(block: "np.ndarray", scratch: "np.ndarray") -> "np.ndarray":
    """Each row less its highest logit, in scratch (exp of it cannot overflow)."""
    import numpy as np

    return np.subtract(block, block.max(axis=1, keepdims=True), out=scratch[:len(block)])


def _log_z(shifted: "np.ndarray") -> list[float]:
    """Each shifted row's log-sum-exp (its log-softmax's normaliser); shifted is overwritten."""
    import numpy as np

    return np.log(np.exp(shifted, out=shifted).sum(axis=1)).tolist()


def _near_top(shifted: "np.ndarray", wanted: int) -> "Optional[np.ndarray]":
    """The ids of one shifted row's logits (its highest is 0) within the widest of NEAR, NEAR/2, ...
    nats below the highest that holds at most MAX_CANDIDATES of them. None where a window holds
    fewer than `wanted` first (the top is flat and then steep), or none down to NARROWEST holds few
    enough (many equal at the top): a partition finds them then. Each window holding `wanted` or
    more holds the `wanted` highest, and every logit equal to the lowest of them."""
    import numpy as np

    near = NEAR
    while near >= NARROWEST:
        inside = shifted >= -near
        count = np.count_nonzero(inside)  # a row at a time: numpy counts a 2-D axis several times slower
        if count < wanted:
            return None
        if count <= MAX_CANDIDATES:
            return np.flatnonzero(inside)
        near /= 2
    return None


def _top_k(shifted: "np.ndarray", near: "Optional[np.ndarray]", k: int) -> list[tuple[int, float]]:
    """The k highest of one shifted row (ties to the lower id), given the ids _near_top found, or
    None where it found none."""
    import numpy as np

    if near is None:
        n = len(shifted) - min(k, len(shifted))
        near = np.flatnonzero(shifted >= np.partition(shifted, n)[n])
    values = shifted[near]
    return [(int(near[j]), float(values[j])) for j in np.lexsort((near, -values))[:k]]


NORMALIZER_ROWS = 16  # rows made float64 at once: a scored step's 1024 rows × 150k vocabulary would be 1.2 GB


def log_normalizers(logits: "np.ndarray") -> tuple["np.ndarray", "np.ndarray"]:
    """Each row's highest logit and log-sum-exp, the log-softmax's normaliser (float64: a 150k
    vocabulary summed in float32 loses the last digits). A few rows at a time: each row's numbers
    are its own, and the float64 copies stay small."""
    import numpy as np

    top = np.empty(len(logits))
    log_z = np.empty(len(logits))
    for at in range(0, len(logits), NORMALIZER_ROWS):
        rows = logits[at:at + NORMALIZER_ROWS].astype(np.float64)
        top[at:at + len(rows)] = rows.max(axis=1)
        rows -= top[at:at + len(rows), None]
        np.exp(rows, out=rows)
        log_z[at:at + len(rows)] = top[at:at + len(rows)] + np.log(rows.sum(axis=1))
    return top, log_z


def answer_tokens(pieces: Sequence[bytes], n_chars: int) -> int:
    """How many of the generated tokens (their pieces, in order) the answer holds when its text
    was cut to n_chars characters (a stop string begins there): the tokens that start before the
    cut. The text is decoded as the cut was found (sequence.decode_text, a character counted once
    its last byte has come: the byte tokens of one character all start at that character)."""
    raw = bytearray()
    for i, piece in enumerate(pieces):
        if len(decode_text(bytes(raw), final=False)) >= n_chars:
            return i
        raw += piece
    return len(pieces)
