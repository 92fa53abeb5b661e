"""Token log-probabilities from logits rows, and which of them belong to an answer. Pure: numpy
arrays in, numbers out (workers/llama/sampling.py hands over llama.cpp's rows).

A token's log-probability is the log-softmax of the raw logits over the whole vocabulary, before
temperature, top-k/top-p, penalties, logit_bias or a grammar's mask: the model's own
distribution, as OpenAI and llama-server report it, so the numbers do not change with the
sampling settings that picked the token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .sequence import decode_text

if TYPE_CHECKING:
    import numpy as np

# Digits kept of each log-probability: far below any difference a reader acts on, and the
# journal and the answers file stay short.
DIGITS = 6
# The top k are looked for in groups of a row: GROUP_SIZE logits, each a row's length / GROUP_SIZE
# ids from the next (a row seen as GROUP_SIZE runs side by side, so the groups' maxima are one pass
# of elementwise maxima over the runs, as cheap as the row's own maximum). The k-th highest of the
# groups' maxima is at most the row's k-th highest logit (those maxima are k of its logits), so
# every logit the top k hold lies in a group whose maximum reaches it: k groups of a row without
# ties, k × GROUP_SIZE logits to sort whatever the row's shape, flat (a random-weight model's
# 151,936-token vocabulary within a nat of the top) or peaked. Where ties at the k-th maximum bring
# more groups, holding more than MAX_CANDIDATES logits (many equal at the top), or the row is too
# short for k groups, a partition of the whole row finds them.
GROUP_SIZE = 64
MAX_CANDIDATES = 1024


def row_logprobs(row: "np.ndarray", token: int, k: int,
                 scratch: "np.ndarray") -> tuple[float, list[tuple[int, float]]]:
    """The picked token's log-probability in one logits row, and the k most likely (token,
    log-probability), most likely first, a tie to the lower id: block_logprobs of a block of one
    row. `scratch`: a float32 buffer of the row's length, overwritten."""
    return block_logprobs(row[None, :], [token], k, scratch[None, :])[0]


def block_logprobs(block: "np.ndarray", tokens: Sequence[int], k: int,
                   scratch: "np.ndarray") -> list[tuple[float, list[tuple[int, float]]]]:
    """row_logprobs of each row of `block` (rows × vocabulary), the passes over the vocabulary made
    over all the rows at once. `scratch`: a float32 buffer at least the block's shape, overwritten;
    it may be the block itself (no allocation per row: a row of a 150k vocabulary is 600 KB).

    Whole-block passes matter where threads share the work (workers/llama/sampling.py): numpy lets
    go of the GIL inside a pass and takes it back after, and a thread waits its turn at every
    hand-over, so a few passes a block scale over cores where a dozen a row do not.

    The exp over the whole vocabulary is the cost (the normaliser needs every term). The top k
    are the k highest logits, ties to the lower id, found among a few hundred candidates a row
    (_top_ids) before the logits are shifted in place."""
    import numpy as np

    n = len(block)
    wanted = min(k, block.shape[1])
    highest, best = _top_ids(block, wanted) if wanted > 0 else (block.max(axis=1), [[] for _ in range(n)])
    shifted = _shifted(block, scratch, highest)
    chosen = shifted[np.arange(n), list(tokens)].tolist()
    top = [list(zip(ids, shifted[i, ids].tolist())) for i, ids in enumerate(best)]
    log_z = _log_z(shifted)
    return [(round(c - z, DIGITS), [(t, round(v - z, DIGITS)) for t, v in row_top])
            for c, z, row_top in zip(chosen, log_z, top)]


def tokens_logprobs(row: "np.ndarray", tokens: Sequence[int], scratch: "np.ndarray") -> list[float]:
    """The log-probability of each of these tokens at one logits row (unrounded), by the same
    arithmetic as block_logprobs's: a choice read from the logits has the number its token's
    log-probability entry shows. `scratch`: a float32 buffer of at least the row's length."""
    shifted = _shifted(row[None, :], scratch[None, :len(row)], row[None, :].max(axis=1))
    values = shifted[0, list(tokens)].tolist()
    z = _log_z(shifted)[0]
    return [v - z for v in values]


def _shifted(block: "np.ndarray", scratch: "np.ndarray", highest: "np.ndarray") -> "np.ndarray":
    """Each row less its highest logit, in scratch (exp of it cannot overflow)."""
    import numpy as np

    shifted: np.ndarray = np.subtract(block, highest[:, None], out=scratch[:len(block)])
    return shifted


def _log_z(shifted: "np.ndarray") -> list[float]:
    """Each shifted row's log-sum-exp (its log-softmax's normaliser); shifted is overwritten."""
    import numpy as np

    log_z: list[float] = np.log(np.exp(shifted, out=shifted).sum(axis=1)).tolist()
    return log_z


def _top_ids(block: "np.ndarray", k: int) -> tuple["np.ndarray", list[list[int]]]:
    """Each row's highest logit, and the ids of its k highest logits, highest first, a tie to the
    lower id (k at least 1, at most the row's length). The candidates come from the groups whose
    maxima reach the k-th highest group maximum (GROUP_SIZE's comment), and from the few logits
    past the last whole group; a row whose groups hold too many, from a partition of the row."""
    import numpy as np

    n, width = block.shape
    apart = width // GROUP_SIZE
    if apart < k:
        return block.max(axis=1), [_order(row, _partition_ids(row, k), k) for row in block]
    runs = block[:, :apart * GROUP_SIZE].reshape(n, GROUP_SIZE, apart)
    group_max = runs.max(axis=1)
    kth = np.partition(group_max, apart - k, axis=1)[:, apart - k].tolist()
    highest = group_max.max(axis=1)
    tail = np.arange(apart * GROUP_SIZE, width)
    if len(tail):
        highest = np.maximum(highest, block[:, tail[0]:].max(axis=1))
    offsets = np.arange(GROUP_SIZE)[:, None] * apart
    best = []
    for row, row_max, floor in zip(block, group_max, kth):
        groups = np.flatnonzero(row_max >= floor)
        if len(groups) > k and len(groups) * GROUP_SIZE > MAX_CANDIDATES:
            ids = _partition_ids(row, k)
        else:
            ids = np.concatenate(((offsets + groups).ravel(), tail))
            ids = ids[row[ids] >= floor]
        best.append(_order(row, ids, k))
    return highest, best


def _partition_ids(row: "np.ndarray", k: int) -> "np.ndarray":
    """The ids of every logit at least as high as the row's k-th highest, by a partition of it."""
    import numpy as np

    at = len(row) - k
    return np.flatnonzero(row >= np.partition(row, at)[at])


def _order(row: "np.ndarray", ids: "np.ndarray", k: int) -> list[int]:
    """The k of these ids whose logits are highest, highest first, a tie to the lower id."""
    import numpy as np

    highest: list[int] = ids[np.lexsort((ids, -row[ids]))[:k]].tolist()
    return highest


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
