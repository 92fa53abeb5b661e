"""What a pool's calls raise beside the job's own errors (runner/errors.py)."""

from __future__ import annotations

from ..errors import GgbatchError, InputError


class PoolClosed(GgbatchError):
    """The pool was closed (or its workers could not go on) before the call was answered."""


class Untokenizable(InputError):
    """A text Pool.tokenize was given that the model's tokenizer cannot take: `name` says which
    (as the caller named it), `reason` why, so a caller can say it in its own words."""

    def __init__(self, where: str, name: str, reason: str) -> None:
        super().__init__(f"{where}: {name}: the model's tokenizer cannot take its text: {reason}")
        self.name, self.reason = name, reason
