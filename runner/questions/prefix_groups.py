"""Which questions share a prefix worth computing once, and the order that sends them together.

Sorted by their tokens, prompts that share a prefix (a passage, a subject's few-shot examples)
stand next to each other, whatever order the file has them in; the common length of two
neighbours is what they share. A group is a run of neighbours sharing MIN_SHARED tokens or more
beyond the prefix every prompt has (which each worker computes once anyway). Groups nest the way
the prompts do (a subject's examples, then a passage within it): sorting keeps nested runs
inside their parent, and each worker's prefix cache (workers/engine/prefix_cache.py) finds the deepest
prefix it holds by itself, so the order is all the coordinator has to get right.

The order is groups by their work (longest first, as single questions were before), each
group's questions in token order: a worker asking for questions gets a group's questions together
and computes its prefix once, and a group that shares as a tree (lm-eval's few-shot examples,
drawn in a different order for each question) is walked depth first, so a question's deepest
shared prefix is in a slot the worker has just filled rather than one long since reused.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Sequence

from ...workers.engine.sequence import common_prefix_len
from ...workers.protocol import Question

# Tokens beyond the job's shared prefix that make neighbours a group: fewer are cheaper to
# compute again than to keep together.
MIN_SHARED = 32


@dataclass(frozen=True)
class Group:
    members: tuple[int, ...]  # indices of the prompts, in token order
    shared: int  # tokens every member starts with
    work: int  # prompt tokens the group costs with its shared tokens computed once


@dataclass(frozen=True)
class Sharing:
    """What grouping found, for the log and the report."""

    groups: int  # groups of two or more questions
    grouped: int  # questions in them
    shareable: int  # prompt tokens that need not be computed again (beyond the job's prefix)


def find_groups(prompts: Sequence[array[int]], n_prefix: int, min_shared: int = MIN_SHARED) -> list[Group]:
    """Every prompt in exactly one group (most are groups of one when nothing is shared)."""
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    groups: list[Group] = []
    run: list[int] = []
    shared = 0
    for i in order:
        if run:
            common = common_prefix_len(prompts[run[-1]], prompts[i])
            if common >= n_prefix + min_shared:
                run.append(i)
                shared = min(shared, common)
                continue
            groups.append(_group(run, shared, prompts))
        run, shared = [i], len(prompts[i])
    if run:
        groups.append(_group(run, shared, prompts))
    return groups


def _group(run: list[int], shared: int, prompts: Sequence[array[int]]) -> Group:
    work = sum(len(prompts[i]) for i in run) - (len(run) - 1) * shared
    return Group(tuple(run), shared, work)


def grouped_order(prompts: Sequence[array[int]], n_prefix: int) -> tuple[list[tuple[int, int]], Sharing]:
    """(index of a prompt, its group number from 1, or 0 alone) in dispatch order, and what
    sharing it found."""
    groups = find_groups(prompts, n_prefix)
    groups.sort(key=lambda g: g.work, reverse=True)
    several = [g for g in groups if len(g.members) > 1]
    sharing = Sharing(len(several), sum(len(g.members) for g in several),
                      sum((len(g.members) - 1) * (g.shared - n_prefix) for g in several))
    numbers = {id(g): n for n, g in enumerate(several, 1)}
    return [(i, numbers.get(id(g), 0)) for g in groups for i in g.members], sharing


def whole_groups(pending: Sequence[Question], n: int) -> int:
    """How many of the first n pending questions to send: cut back to where a group starts
    rather than split it between workers, unless that leaves less than half the chunk (a group
    larger than that is split: each part computes its prefix once)."""
    if n >= len(pending) or not pending[n].group or pending[n].group != pending[n - 1].group:
        return n
    start = n - 1
    while start > 0 and pending[start - 1].group == pending[n].group:
        start -= 1
    return start if 2 * start >= n else n
