"""A bounded sample of a stream of timings (the answers' latency and time to first token), for
the report's percentiles: a warm pool kept open as a service answers for days, and one number
kept per answer would grow without end.

The first KEPT values are all kept, so a run of up to that many answers has exact percentiles;
past them each new value replaces a kept one with the chance that leaves a uniform sample of
every value so far (Vitter's algorithm R). The maximum is kept apart, exact whatever the count."""

from __future__ import annotations

import random
from array import array
from typing import Iterator, Optional

KEPT = 65536  # values: 512 KiB of doubles per reservoir


class Reservoir:
    def __init__(self, kept: int = KEPT, seed: int = 0) -> None:
        self.values = array("d")
        self.kept = kept
        self.seen = 0  # values offered, kept or not
        self.most: Optional[float] = None  # the largest of them all
        # seeded: the same answers give the same report
        self._random = random.Random(seed)

    def append(self, value: float) -> None:
        self.seen += 1
        self.most = value if self.most is None else max(self.most, value)
        if len(self.values) < self.kept:
            self.values.append(value)
            return
        slot = self._random.randrange(self.seen)
        if slot < self.kept:
            self.values[slot] = value

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[float]:
        return iter(self.values)
