"""What the progress line says besides the count: live token rates and the time left. Pure.

Questions finish in waves when a job is about as big as its slots (32 questions on 32 slots all
finish within a few steps of each other, after the whole run), so the rate of finished questions
says nothing for most of the run. Tokens move every step: the workers send their engines'
counters (EngineStats, at most every 0.5 s), from which come the live rates and the time left.
"""

from __future__ import annotations

from collections import deque
from typing import Optional, Sequence

WINDOW_S = 5.0


class RateWindow:
    """Rates of cumulative counters over about the last WINDOW_S seconds, from the times they
    changed (an EngineStats message: every 0.5 s, or every step when a step is slower). The
    window always spans the last two changes, so a model whose steps take 10 s still shows its
    rate, not 0 between steps; when the next change is overdue (later than the window and the
    last interval between changes: a stall, a pause) the rates fall with the time since."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, int, int]] = deque()  # (time, generated, prompt) at each change

    def add(self, t: float, generated: int, prompt: int) -> None:
        if self._points and self._points[-1][1:] == (generated, prompt):
            return
        self._points.append((t, generated, prompt))
        # Keep the last point at or before the window's start, and always the last two changes.
        while len(self._points) > 2 and self._points[1][0] <= t - self.window_s:
            self._points.popleft()

    def rates(self, now: float) -> tuple[float, float]:
        """(generated, prompt) tokens per second; 0 before two changes."""
        if len(self._points) < 2:
            return 0.0, 0.0
        (t0, g0, p0), (t_prev, _, _), (t1, g1, p1) = self._points[0], self._points[-2], self._points[-1]
        end = now if now - t1 > max(self.window_s, t1 - t_prev) else t1
        return ((g1 - g0) / (end - t0), (p1 - p0) / (end - t0)) if end > t0 else (0.0, 0.0)


def tokens_left(total: int, done: int, done_tokens: int, generated: int, max_tokens: int) -> float:
    """Tokens still to generate: every question's expected length (the mean answer so far, or
    max_tokens before any answer) less what is generated already, finished or not."""
    if total <= done:
        return 0.0
    mean = done_tokens / done if done else float(max_tokens)
    return max(0.0, total * mean - max(generated, done_tokens))


def expected_length(max_tokens: int, contexts: Sequence[int]) -> int:
    """An answer's length before any is in: max_tokens, or the longest sequence context where that
    is less (a max_tokens of 10**8 ends where the context does; 0: a context not known yet)."""
    known = [n for n in contexts if n > 0]
    return min(max_tokens, max(known)) if known else max_tokens


def generating(generated: int, done_tokens: int, slots: int, left_q: int) -> bool:
    """Whether the engines are generating in earnest: the questions in flight have a token
    each, on average. Before that (the first prompts being decoded) the generation rate is that
    of a few first tokens and would promise hours."""
    return left_q > 0 and generated - done_tokens >= min(slots, left_q)


def eta_s(left: float, rate: float) -> Optional[float]:
    """Seconds left at `rate` tokens per second; None without a rate."""
    if left <= 0:
        return 0.0
    return left / rate if rate > 0 else None
