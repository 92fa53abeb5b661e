"""Per-question columns compact enough for files of millions of questions: what the coordinator
keeps of every question once its window has gone to the workers (runner/questions/prepare.py).

    IdColumn    the ids in input order, one bytes blob (a million ids of ~10 characters: ~18 MB,
                against ~65 MB as a list of str), and for each the question whose answer it
                takes when its prompt is another's (8 bytes, where a dict of aliases takes ~150)
    HashIndex   64-bit key -> int64 value, sorted numpy arrays (16 bytes an entry) plus a small
                dict of the latest additions merged in now and then (a dict of a million int
                keys and values would take ~100 MB)
    IdSet       a set of some of the ids (OpenAI Batch lines that are /v1/completions, refused,
                held to a grammar: possibly every line), 16 bytes an id where a set of str
                takes ~100; a hit is checked against the id itself in the IdColumn

numpy is imported only once an index outgrows its dict (MERGE_AT keys): a job of a few thousand
questions starts without it (runner/job.py's start-up, and every spawned worker's re-import of
the main module, would pay half a second).

Keys are 64-bit hashes: key64() of bytes that are written down (a record's line in the journal,
the same in every run: blake2b), text_key() of an id, which never leaves this process (Python's
own string hash: SipHash, keyed per process, and a twentieth of blake2b's cost, which counts when
a resumed file of a million lines is read). Two different texts share a key with odds of about
n² / 2^65 (3e-8 for a million): callers that must be exact check the text behind a hit.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from array import array
from bisect import bisect_left
from typing import Any, Iterable, Iterator, Optional, Sequence

MERGE_AT = 1 << 16  # additions held in the dict before they are merged into the arrays


def key64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


U64 = (1 << 64) - 1


def text_key(text: str) -> int:
    """A key for an id within this process only (it differs from one run to the next)."""
    return hash(text) & U64


class IdColumn:
    """Question ids in input order, and which question's answer each takes."""

    def __init__(self) -> None:
        self._blob = bytearray()
        self._ends = array("q")
        self._same_as = array("q")  # index of the question whose answer it takes (-1: its own)

    def append(self, qid: str) -> int:
        """Add an id; returns its index."""
        self._blob += qid.encode("utf-8", "surrogatepass")
        self._same_as.append(-1)
        self._ends.append(len(self._blob))
        return len(self._ends) - 1

    def extend(self, qids: Iterable[str]) -> None:
        """append() each id, together (half a million of a resumed journal)."""
        encoded = [qid.encode("utf-8", "surrogatepass") for qid in qids]
        start = len(self._blob)
        # The bytes before the ends that point into them: another thread reading an id (an IdSet's
        # check, in the pool's thread) never sees an end past the blob.
        self._blob += b"".join(encoded)
        self._same_as.extend(itertools.repeat(-1, len(encoded)))
        self._ends.extend(start + end for end in itertools.accumulate(map(len, encoded)))

    def same_as(self, index: int, first: int) -> None:
        """Question `index` takes the answer of question `first` (their prompts are identical)."""
        self._same_as[index] = first

    def answered_as(self) -> Iterator[tuple[str, str]]:
        """(id, id of the question whose answer it takes) in input order."""
        for i, qid in enumerate(self):
            first = self._same_as[i]
            yield qid, qid if first < 0 else self[first]

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str:
        start = self._ends[i - 1] if i > 0 else 0
        return self._blob[start:self._ends[i]].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        start = 0
        for end in self._ends:
            yield self._blob[start:end].decode("utf-8", "surrogatepass")
            start = end


class HashIndex:
    """64-bit key -> int64 value; adding a key again replaces its value. The merged keys are an
    array('Q') searched with bisect, one key at a time (numpy's searchsorted costs several µs a
    call on a scalar, bisect over an array one), or with numpy for many keys at once.

    Safe to share between threads: a streamed run's feed thread adds the answers it reuses from
    the journal while the pool's thread adds new ones and reads (runner/questions/feed.py). One lock holds
    every access, so that a merge (the dict into the arrays, the arrays swapped, the dict emptied)
    is one step to any other thread: an addition made meanwhile is neither dropped nor merged
    twice, and a reader never sees the new keys beside the old values."""

    def __init__(self, merge_at: Optional[int] = None) -> None:
        """merge_at: additions held in the dict before they are merged into the arrays (MERGE_AT,
        read now)."""
        self._keys = array("Q")  # sorted
        self._values = array("q")
        self._recent: dict[int, int] = {}
        self._merge_at = merge_at or MERGE_AT
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._merge()
            return len(self._keys)

    def add(self, key: int, value: int) -> None:
        with self._lock:
            self._recent[key] = value
            if len(self._recent) >= self._merge_at:
                self._merge()

    def get(self, key: int) -> Optional[int]:
        with self._lock:
            value = self._recent.get(key)
            if value is not None:
                return value
            i = bisect_left(self._keys, key)
            return self._values[i] if i < len(self._keys) and self._keys[i] == key else None

    def get_many(self, keys: Sequence[int]) -> list[Optional[int]]:
        """get() of each key, the arrays searched once for all of them."""
        with self._lock:
            if not self._keys:
                return [self._recent.get(k) for k in keys]
            import numpy as np

            merged = np.frombuffer(self._keys, np.uint64)
            wanted = np.fromiter(keys, np.uint64, len(keys))
            # Searched in sorted order (each search starts from the last one's place: 2-3x faster).
            order = np.argsort(wanted)
            at = np.empty(len(wanted), np.intp)
            at[order] = np.minimum(np.searchsorted(merged, wanted[order]), len(merged) - 1)
            found = (merged[at] == wanted).tolist()
            values = np.frombuffer(self._values, np.int64)[at].tolist()
            recent = self._recent
            return [recent.get(k, v if hit else None) for k, v, hit in zip(keys, values, found)]

    def add_many(self, keys: Sequence[int], values: Sequence[int]) -> None:
        """add() of each pair in order. Many at once (a resumed journal's half million) go
        straight into the arrays, without a dict of them all on the way."""
        with self._lock:
            if len(keys) < self._merge_at:
                self._recent.update(zip(keys, values))
                if len(self._recent) >= self._merge_at:
                    self._merge()
                return
            import numpy as np

            self._merge()  # what is in the dict was added before these
            new_keys = np.fromiter(keys, np.uint64, len(keys))
            order = np.argsort(new_keys, kind="stable")  # a key added twice: its later value last
            new_keys, new_values = new_keys[order], np.fromiter(values, np.int64, len(values))[order]
            last = np.append(new_keys[1:] != new_keys[:-1], True)
            self._insert(new_keys[last], new_values[last])

    def _merge(self) -> None:
        """The recent additions into the sorted arrays (the caller holds the lock): sorted alone,
        then inserted in place (a merge, linear in the index's size, where sorting the whole index
        again each merge_at additions would cost a second over a resumed million)."""
        if not self._recent:
            return
        import numpy as np

        n = len(self._recent)
        new_keys = np.fromiter(self._recent.keys(), np.uint64, n)
        order = np.argsort(new_keys)
        self._insert(new_keys[order], np.fromiter(self._recent.values(), np.int64, n)[order])
        self._recent.clear()

    def _insert(self, new_keys: Any, new_values: Any) -> None:
        """Sorted, distinct keys (numpy arrays) and their values into the arrays (the caller
        holds the lock): a key held already takes its new value."""
        import numpy as np

        keys, values = np.frombuffer(self._keys, np.uint64), np.frombuffer(self._values, np.int64).copy()
        at = np.searchsorted(keys, new_keys)
        held = np.zeros(len(new_keys), bool)
        inside = at < len(keys)
        held[inside] = keys[at[inside]] == new_keys[inside]
        values[at[held]] = new_values[held]
        fresh = ~held
        keys, values = np.insert(keys, at[fresh], new_keys[fresh]), np.insert(values, at[fresh], new_values[fresh])
        self._keys, self._values = array("Q", keys.tobytes()), array("q", values.tobytes())


class IdSet:
    """Some of the ids of an IdColumn (each added with its index there)."""

    def __init__(self, ids: IdColumn, merge_at: Optional[int] = None) -> None:
        self._ids = ids
        self._index = HashIndex(merge_at)

    def add(self, qid: str, index: int) -> None:
        self._index.add(text_key(qid), index)

    def __contains__(self, qid: object) -> bool:
        if not isinstance(qid, str):
            return False
        index = self._index.get(text_key(qid))
        return index is not None and self._ids[index] == qid

    def __len__(self) -> int:
        return len(self._index)
