"""One llama_decode's batch: the arrays handed to llama.cpp for the scheduled spans, and which
logits row belongs to which span. Pure: numpy arrays, no llama.cpp here."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import loglik
from .scheduler import Span
from .sequence import Phase


@dataclass
class Batch:
    """One llama_decode: the spans scheduled, the arrays handed to llama.cpp (ballast included),
    the ballast's sequence ids, and (span, batch index, logits row) for each span with logits."""

    spans: list[Span] = field(default_factory=list)
    arrays: tuple[np.ndarray, ...] = ()
    ballast: list[int] = field(default_factory=list)
    rows: list[tuple[Span, int, int]] = field(default_factory=list)


def batch_arrays(spans: list[Span]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    total = sum(s.n for s in spans)
    tokens = np.empty(total, np.int32)
    pos = np.empty(total, np.int32)
    seq_ids = np.empty(total, np.int32)
    logits = np.zeros(total, np.int8)
    i = 0
    for span in spans:
        seq, n = span.seq, span.n
        if seq.phase is Phase.DECODE:
            tokens[i] = seq.output[-1]
        else:
            tokens[i:i + n] = np.frombuffer(seq.prompt, dtype=np.int32)[span.start_pos:span.start_pos + n]
        pos[i:i + n] = np.arange(span.start_pos, span.start_pos + n, dtype=np.int32)
        seq_ids[i:i + n] = seq.seq_id
        if seq.scoring is not None:  # the rows that score its continuation, not its last token's
            lo, hi = loglik.logit_range(seq, span.start_pos, n)
            logits[i + lo:i + hi] = 1
        elif span.wants_logits:
            logits[i + n - 1] = 1
        i += n
    return tokens, pos, seq_ids, logits


def logit_index(spans: list[Span]) -> list[tuple[Span, int]]:
    """(span, batch index of its last token) for the spans that asked for a token to be picked
    (a scored prompt's rows are read apart: scored_rows)."""
    rows, i = [], 0
    for span in spans:
        i += span.n
        if span.wants_logits and span.seq.scoring is None:
            rows.append((span, i - 1))
    return rows


def scored_rows(spans: list[Span]) -> list[tuple[Span, int, int, int]]:
    """(span, batch index, position, row count) of the logits rows each scored prompt's chunk
    asked for: from that batch index and position on, count rows."""
    out, i = [], 0
    for span in spans:
        if span.seq.scoring is not None:
            lo, hi = loglik.logit_range(span.seq, span.start_pos, span.n)
            if hi > lo:
                out.append((span, i + lo, span.start_pos + lo, hi - lo))
        i += span.n
    return out
