"""Where a reasoning model's output is: opening, inside its thinking block, or answering; and the
end of the block written for it when its thinking budget is spent. Pure: token ids in, token ids
out (the engine's picker, workers/llama/picking.py, asks it before each pick).

    prompt ends in `start` ──▶ THINKING      (the chat template opened the block; `<think>\n` too)
    otherwise              ──▶ OPENING ──first token `start`──▶ THINKING
                                      └─anything else──────▶ ANSWER   (harmony: only `end` does)
    THINKING ──`budget` tokens──▶ `forced` tokens written, one a step ──▶ ANSWER
             └─the model's own `end`───────────────────────────────────▶ ANSWER

Only in ANSWER do fixed choices and grammars apply: a grammar is asked from the first token after
the end, and choices are read from the logits of that position. The forced tokens depend on the
count of tokens only, never on logits, so a forced end is as deterministic, batch-invariant and
resumable as the greedy tokens before it.
"""

from __future__ import annotations

import enum
from typing import Optional, Sequence

from ..protocol import Thinking


class Where(enum.Enum):
    OPENING = "opening"  # no token yet says whether the model thinks
    THINKING = "thinking"
    ANSWER = "answer"


def ends_with(tokens: Sequence[int], tail: Sequence[int]) -> bool:
    return bool(tail) and len(tokens) >= len(tail) and list(tokens[len(tokens) - len(tail):]) == list(tail)


def opened(prompt: Sequence[int], start: Sequence[int], blank: Sequence[int]) -> bool:
    """Whether the prompt ends in the block's opening, whitespace after it aside (`<think>\n`)."""
    end = len(prompt)
    while end > 0 and prompt[end - 1] in blank:
        end -= 1
    return ends_with(prompt[:end], start)


def overlap(tokens: Sequence[int], forced: Sequence[int]) -> int:
    """How many of `forced`'s first tokens `tokens` already ends with (the model began the
    close itself: harmony's <|end|><|start|>), so only the rest is written."""
    for n in range(min(len(forced), len(tokens)), 0, -1):
        if ends_with(tokens, forced[:n]):
            return n
    return 0


class ThinkState:
    """One sequence's place in its thinking block (`spec`: the model's tokens and the budget)."""

    def __init__(self, spec: Thinking, prompt: Sequence[int]) -> None:
        self.spec = spec
        self.where = Where.OPENING
        self.count = 0  # thinking tokens the model chose (forced ones not counted)
        self.pending: list[int] = []  # forced tokens still to write
        self.tail: list[int] = []  # the last generated tokens, as long as the longest marker
        self.skipped = False  # the model answered without a block: its answer holds its first token
        self._keep = max(len(spec.start), len(spec.end), len(spec.forced))
        self.marks = frozenset(spec.start) | frozenset(spec.end) | frozenset(spec.forced)
        if opened(prompt, spec.start, spec.blank):
            self._think()

    @property
    def answering(self) -> bool:
        return self.where is Where.ANSWER

    def next_forced(self) -> Optional[int]:
        """The token to write instead of sampling, or None: the model chooses."""
        return self.pending[0] if self.pending else None

    def answers_with(self, token: int) -> bool:
        """Whether the model, choosing `token` first, answers without thinking (`<think>` is one
        token): then it is answering from this very position, under any grammar or choices."""
        if self.where is Where.OPENING and not self.spec.header and not self.tail and token != self.spec.start[0]:
            self.where, self.skipped = Where.ANSWER, True
        return self.where is Where.ANSWER

    def see(self, token: int) -> None:
        """Take the token generated (or forced) at this position."""
        self.tail = (self.tail + [token])[-self._keep:]
        if self.where is Where.ANSWER:
            return
        if ends_with(self.tail, self.spec.end):
            self.where, self.pending = Where.ANSWER, []
        elif self.where is Where.OPENING:
            if ends_with(self.tail, self.spec.start):
                self._think()
            elif not self.spec.header:
                self.where, self.skipped = Where.ANSWER, True  # the model answers without thinking
        elif self.pending and token == self.pending[0]:
            self.pending.pop(0)
        else:
            self.count += 1
            self._check_budget()

    def _think(self) -> None:
        self.where, self.count = Where.THINKING, 0
        self._check_budget()

    def _check_budget(self) -> None:
        budget = self.spec.budget
        if budget is not None and self.count >= budget and not self.pending:
            self.pending = list(self.spec.forced[overlap(self.tail, self.spec.forced):])
