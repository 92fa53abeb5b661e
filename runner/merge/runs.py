"""What the runs that wrote the parts of a merge say of them, beyond their answers files: a run
still going (its lock held, as `ggbatch run` finds it: runner/files/lock.py), a run stopped
before writing its answers (its journal written after its answers file, holding answers the file
lacks), and answers made for another version of a question than the question file holds. Each
part's run files are where a run writing it keeps them: beside the file its path leads to
(runner/files/paths.py)."""

from __future__ import annotations

import os
from array import array
from typing import Mapping, Optional, Sequence

from ..errors import ConfigError, quote
from ..files.compact import text_key
from ..files.lock import lock_holder
from ..files.paths import journal_of, lock_path
from ..journal.index import read_earlier
from .parts import Part

SHOWN = 5  # ids named in a line


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


def answered_otherwise(part: Part, digests: Mapping[str, int], questions: str) -> Optional[str]:
    """The part's questions whose answers its journal says were made for another version of their
    record than the question file holds now (Record.digest of the line: the hash the run keeps in
    each entry, runner/journal/journal.py), said in a line; None when there are none, or when the
    part was written after the question file last changed: then its run read this version, and
    kept an answer only where its prompt had not changed (an edit of a field the prompt does not
    read leaves the entry's hash as it was, and the answer right)."""
    try:
        if os.stat(questions).st_mtime_ns <= os.stat(part.path).st_mtime_ns:
            return None
        earlier = read_earlier(journal_of(part.path))
    except OSError:
        return None
    if earlier is None or earlier.fingerprint is None:
        return None
    qids = [row.qid for row in part.rows if digests.get(row.qid)]
    rows = earlier.rows.get_many(array("Q", map(text_key, qids)))
    # an entry of an older version has no record hash (0): it cannot say
    other = [qid for qid, row in zip(qids, rows)
             if row is not None and row >= 0 and earlier.records[row] not in (0, digests[qid])]
    if not other:
        return None
    more = f" and {len(other) - SHOWN} more" if len(other) > SHOWN else ""
    return (f"{part.path}: {len(other)} of its answers {'was' if len(other) == 1 else 'were'} made for another "
            f"version of {'its question' if len(other) == 1 else 'their questions'} than {questions} holds now "
            f"({', '.join(map(quote, other[:SHOWN]))}{more}, as its journal says; {questions} was changed after "
            f"{part.path} was written): rerun its shard to answer {'it' if len(other) == 1 else 'them'} again")
