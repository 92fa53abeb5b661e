"""A step's token log-probabilities computed while the next llama_decode runs.

With every layer on a GPU a worker holds its cores for one llama.cpp thread, and the host's work
between two decodes is a cost of each step: a log-softmax over each row's logits (151,936 of them
on a Qwen vocabulary) took longer than the GPU's step itself (docs/performance/pools-and-weighing.md,
"On a GPU: one H200"). No token waits for those numbers, so where llama.cpp's threads leave the
worker's cores free they are worked out beside the next decode instead of before it:

    step t:    decode ─ pick tokens ─ copy the rows asked ─┐ (finish, admit, schedule)
    step t+1:  decode ─────────────────────────────────────┴ log-softmax on a thread of its own
               join: the entries added to their sequences ─ pick tokens ─ ...

The rows are copied out first because the next decode writes over llama.cpp's. The entries are
added once that decode has returned, before anything reads them or resets a sequence (a
preemption clears what it had generated); a sequence that finishes at step t has its own worked
out at once, as its answer is written then (workers/llama/picking.py record_logprobs). On the CPU,
where llama.cpp's threads take every core the worker has, nothing is left for this: the numbers
are computed before the next decode, as they always were.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import numpy as np

from .sampling import Logprobs, Sampling

Then = Callable[[list[Logprobs], float], None]  # the entries, and the seconds their work took


class LaterLogprobs:
    def __init__(self, sampling: Sampling, threads: int) -> None:
        self._sampling = sampling
        self._threads = threads  # of the worker's threads, those llama.cpp's leave free
        self._thread: Optional[ThreadPoolExecutor] = None  # made on first use
        self._rows: Optional[np.ndarray] = None  # the copied rows; reused, grown as needed
        self._pending: Optional[tuple[Future[tuple[list[Logprobs], float]], Then]] = None

    def start(self, rows: Sequence[int], tokens: Sequence[int], k: int, n_outputs: int, then: Then) -> None:
        """Copy these rows of the last decode's n_outputs logits rows, and work out each token's
        log-probability and the k most likely on a thread of their own; `then` gets them at join()."""
        self.join()  # the one before: its rows' buffer is this one's
        self._rows = self._sampling.copy_rows(rows, n_outputs, self._rows)
        block = self._rows[:len(rows)]
        tokens = list(tokens)

        def work() -> tuple[list[Logprobs], float]:
            t0 = time.perf_counter()
            return self._sampling.copied_logprobs(block, tokens, k, self._threads), time.perf_counter() - t0

        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="logprobs")
        self._pending = self._thread.submit(work), then

    @property
    def pending(self) -> bool:
        """Whether rows were started since the last join()."""
        return self._pending is not None

    def join(self) -> None:
        """Wait for the rows started last, if any, and hand their entries to their `then`."""
        if self._pending is not None:
            future, then = self._pending
            self._pending = None
            then(*future.result())

    def close(self) -> None:
        """Wait for the work started last (its entries are not needed: the engine closes)."""
        if self._thread is not None:
            self._thread.shutdown()
            self._thread = None
        self._pending = None
