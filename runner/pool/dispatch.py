"""What a worker that asks for questions gets (runner/pool/pool.py calls this when one asks).

Dispatch is pull-based: a worker says how many questions it wants when its engine runs low, so
no fixed shard can leave one worker busy while another idles. A worker that holds nothing takes
the next suspect alone (a question that was on a worker when it died: runner/pool/crashes.py).
Otherwise it takes pending questions, whole prefix groups, up to what it asked for. Near the end
the chunks shrink: no worker takes more than an even share of what is not answered yet, counting
what it holds, which keeps the tail short and the batches alike.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Collection, Optional, Sequence

from ...workers.protocol import Question
from ..questions.prefix_groups import whole_groups
from .worker_state import WorkerState


def next_chunk(w: WorkerState, live: Sequence[WorkerState], pending: deque[Question],
               suspects: deque[tuple[Question, ...]]) -> Optional[tuple[tuple[Question, ...], bool]]:
    """(the questions worker w gets now, taken off their queue; whether they are a suspect that
    must be answered alone), or None: nothing for it now. `live`: the workers running."""
    if suspects and not w.in_flight:
        return suspects.popleft(), True
    if pending and (share := even_share(w, live, len(pending))) > 0:
        n = whole_groups(pending, min(w.wants, share, len(pending)))
        return tuple(pending.popleft() for _ in range(n)), False
    return None


def even_share(w: WorkerState, live: Sequence[WorkerState], n_pending: int) -> int:
    """How many more questions worker w may take: an even share of everything not answered yet
    (pending, and held by the live workers), less what it holds. Near the end this keeps every
    worker's batch as full as the others' (32 questions, two workers of 16 slots: 16 each, where
    an even share of the pending alone gave the first to ask 16, then halves of the rest to
    whoever asked next: 18/14 on W1). A worker at its share gets nothing: another, below its
    share, takes the rest when it asks, as it does when it runs low."""
    open_questions = n_pending + sum(len(x.in_flight) for x in live)
    return math.ceil(open_questions / max(1, len(live))) - len(w.in_flight)


def withdraw(pending: deque[Question], qids: Collection[str]) -> list[str]:
    """Take the questions `qids` names off `pending` (in place; the others keep their order): the
    ids taken. Those already handed out are not pending, and are answered."""
    taken = [q.qid for q in pending if q.qid in qids] if qids else []
    if taken:
        kept = [q for q in pending if q.qid not in qids]
        pending.clear()
        pending.extend(kept)
    return taken
