"""What the runs that wrote the parts of a merge say of them, beyond their answers files: a run
still going (its lock held, as `ggbatch run` finds it: runner/files/lock.py), and a run stopped
before writing its answers (its journal written after its answers file, holding answers the
file lacks). Each part's run files are where a run writing it keeps them: beside the file its
path leads to (runner/files/paths.py)."""

from __future__ import annotations

import os
from typing import Optional, Sequence

from ..errors import ConfigError
from ..files.lock import lock_holder
from ..files.paths import journal_of, lock_path
from ..journal.index import read_earlier
from .parts import Part


def refuse_running(paths: Sequence[str]) -> None:
    """ConfigError for a part whose run is still going: its answers file is the previous run's
    (or about to be replaced), and its journal grows past it."""
    for path in paths:
        holder = lock_holder(os.path.realpath(path))
        if holder is not None:
            raise ConfigError(f"{path}: its run is still going (pid {holder} holds its lock "
                              f"{lock_path(os.path.realpath(path))}): merge once that run has ended")


def unwritten(part: Part) -> Optional[str]:
    """What a part's journal holds that its answers file does not (a run of it stopped, killed or
    out of room, after answering and before writing its answers), said in a line; None when the
    answers file was written after the journal's last answer (as every run that ends writes it)."""
    journal = journal_of(part.path)
    try:
        if os.stat(journal).st_mtime_ns <= os.stat(part.path).st_mtime_ns:
            return None
        earlier = read_earlier(journal)
    except OSError:
        return None  # no journal beside it (a part copied alone): nothing to say
    if earlier is None or earlier.fingerprint is None:
        return None
    held = {row.qid for row in part.rows}
    lacks = sum(1 for qid in set(earlier.qids) if qid not in held)
    # Only answers the file lacks are said: a journal copied after its part (cp a.shard-* there/)
    # is newer too, and holds what the part holds.
    if not lacks:
        return None
    return (f"{part.path}: its journal holds {lacks} {'answer' if lacks == 1 else 'answers'} it lacks ({journal} "
            "was written after it: a run of it stopped before writing its answers); rerun its shard to write them")
