"""An earlier run's journal, indexed for a rerun (runner/journal/journal.py reuses its answers): what is
needed of each entry (its id, the hashes of its prompt and record, whether it failed, where it
is in the file), read a block of lines at a time without parsing the lines as JSON (a resumed
file of a million questions has a million entries, and each holds an answer's text).

It is read in a thread (start_reading) while the tokenizer process starts: the journal's
fingerprint needs the tokenizer's answer, its entries do not.

An entry as runner/journal/journal.py writes it starts {"qid": "…", "prompt": "…", "record": "…",
"text": and has an "error": key after it: in JSON text an unescaped quote is never inside a
string, so the first '"error": ' outside a string after "text" is the key (a later one is a
choice named "error" in choice_logprobs, which comes after it). A block whose every line matches is read with one
regex pass and list comprehensions; a block with a line that does not (an id with a quote or a
backslash in it, a line from an older version) is parsed as JSON, line by line.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from array import array
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any, Iterator, NamedTuple, Optional, Union

from ..files.compact import HashIndex, IdColumn, text_key
from .ran import legacy_ran, read_ran

BLOCK_BYTES = 1 << 22  # of the journal read at a time
# How the header line Journal writes begins ({"ggbatch_journal": VERSION, ...}, one write): a file
# holding a part of it and no newline is a journal killed while it was being made
TORN_HEADER = b'{"ggbatch_journal": '

ENTRY = re.compile(rb'^(\{"qid": "([^"\\\n]*)", "prompt": "([0-9a-f]*)", (?:"record": "([0-9a-f]*)", )?'
                    rb'"text": [^\n]*?, "error": (null)?[^\n]*\n)', re.MULTILINE)


class Earlier:
    """The entries of an earlier run's journal. Rows are the answers that did not fail, in file
    order; a failed answer stays in the file (its story) but is never reused: it is retried."""

    def __init__(self, fingerprint: Optional[dict[str, Any]]) -> None:
        self.fingerprint = fingerprint  # from its header; None: the file is not a ggbatch journal
        self.ran: Any = None  # what it decided on auto, as written (runner/journal/ran.py)
        self.rows = HashIndex()  # qid key -> row of the columns below, -1: its last answer failed
        self.qids = IdColumn()
        self.records, self.prompts, self.at = array("Q"), array("Q"), array("q")  # of each row
        self.by_record = HashIndex()  # record hash -> row still its id's answer: a line known before it is parsed
        self.kept = 0  # ids whose latest entry is an answer that did not fail (a rerun keeps them)
        self.end = 0  # where its last whole line ends (a torn last line follows)


def holds_answers(earlier: Earlier) -> bool:
    """Whether a rerun could reuse anything of it: a ggbatch journal with an answer that did not
    fail (a file that is not a journal is someone else's: it holds whatever it holds)."""
    return earlier.fingerprint is None or len(earlier.at) > 0


def start_reading(path: str) -> "Future[Optional[Earlier]]":
    """read_earlier in a thread of its own."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="ggbatch-journal")
    try:
        return executor.submit(read_earlier, path)
    finally:
        executor.shutdown(wait=False)


def read_earlier(path: str) -> Optional[Earlier]:
    """The journal at `path` indexed; None: there is none. OSError: it cannot be read."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        header = f.readline()
        if not header.endswith(b"\n") and TORN_HEADER.startswith(header[:len(TORN_HEADER)]):
            return None  # ggbatch's own, killed while writing its header (or empty): it holds nothing
        earlier = Earlier(_fingerprint(header))
        if earlier.fingerprint is None:
            earlier.end = f.tell()
            return earlier
        earlier.ran = read_ran(f)
        earlier.end = f.tell()
        keys, rows = array("Q"), array("q")  # 8 bytes an entry (a list of ints would take 40)
        for e in read_entries(f, earlier.end):
            earlier.end = e.end
            keys.extend(map(text_key, e.qids))
            row = itertools.count(len(earlier.at))
            rows.extend([next(row) if ok else -1 for ok in e.ok])
            earlier.qids.extend(itertools.compress(e.qids, e.ok))
            earlier.prompts.extend(itertools.compress(e.prompts, e.ok))
            earlier.records.extend(itertools.compress(e.records, e.ok))
            earlier.at.extend(itertools.compress(e.at, e.ok))
    if earlier.ran is None and keys:  # answers without a ran line: an older version's
        earlier.ran = legacy_ran(earlier.fingerprint)
    # The keys are added together: one sort of each index, not one every MERGE_AT entries.
    earlier.rows.add_many(keys, rows)
    # A line is known by its record hash only while its row is its id's answer: not after the id
    # was answered again (a later row) or failed since (-1). Entries of older versions have no hash.
    latest = earlier.rows.get_many(array("Q", itertools.compress(keys, (row >= 0 for row in rows))))
    latest_of_id = [last == row for row, last in enumerate(latest)]
    earlier.kept = sum(latest_of_id)
    known = [record != 0 and last for record, last in zip(earlier.records, latest_of_id)]
    earlier.by_record.add_many(array("Q", itertools.compress(earlier.records, known)),
                               array("q", itertools.compress(range(len(known)), known)))
    return earlier


def _fingerprint(header: bytes) -> Optional[dict[str, Any]]:
    try:
        fingerprint = json.loads(header)["fingerprint"]
    except (ValueError, KeyError, TypeError):
        return None
    return fingerprint if isinstance(fingerprint, dict) else None


class Entries(NamedTuple):
    """A block's entries, as columns."""

    at: list[int]  # offset of each in the file
    qids: list[str]
    prompts: array[int]  # prompt_key of each prompt hash ('Q')
    records: array[int]  # prompt_key of each record hash, 0 for none ('Q')
    ok: list[bool]  # answered without an error
    end: int  # offset after the block's last line


def read_entries(f: IO[bytes], at: int) -> Iterator[Entries]:
    """The entries of `f` from its position, which is offset `at`, a block at a time. A last line
    without its line break (a run killed mid-write) is left out: the last block's `end` is where
    the file's whole lines end."""
    tail = b""
    while data := f.read(BLOCK_BYTES):
        block = tail + data
        end = block.rfind(b"\n") + 1
        block, tail = block[:end], block[end:]
        if block:
            yield block_entries(block, at)
            at += len(block)


def block_entries(block: bytes, at: int) -> Entries:
    found = ENTRY.findall(block)
    if len(found) != block.count(b"\n"):
        return parsed_entries(block, at)
    offsets = list(itertools.accumulate((len(f[0]) for f in found[:-1]), initial=at))
    return Entries(offsets, [f[1].decode() for f in found], hex_keys([f[2] for f in found]),
                   hex_keys([f[3] for f in found]), [f[4] != b"" for f in found], at + len(block))


def parsed_entries(block: bytes, at: int) -> Entries:
    """A block's entries, each line parsed as JSON; a line that is not an entry is left out."""
    rows = []
    end = at + len(block)
    for line in block.split(b"\n")[:-1]:  # split on "\n" only, as the file was written
        try:
            e = json.loads(line)
            rows.append((at, e["qid"], e["prompt"].encode(), (e.get("record") or "").encode(), e["error"] is None))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        at += len(line) + 1
    offsets, qids, prompts, records, ok = (list(column) for column in zip(*rows)) if rows else ([],) * 5
    return Entries(offsets, qids, hex_keys(prompts), hex_keys(records), ok, end)


def hex_keys(hashes: list[bytes]) -> array[int]:
    """prompt_key of each hex hash, converted together."""
    digits = b"".join(h[:16].rjust(16, b"0") for h in hashes)
    try:
        keys = array("Q", bytes.fromhex(digits.decode("ascii")))
    except ValueError:  # a hash that is not hex: only in a hand-edited journal
        return array("Q", map(prompt_key, hashes))
    if sys.byteorder == "little":
        keys.byteswap()  # the hex digits are big-endian
    return keys


def prompt_key(h: Union[str, bytes]) -> int:
    """The 64 bits of a hex hash (a prompt's or a record's, as the journal holds it, text or
    bytes) that the indexes keep; 0 for none, or one that is not hex."""
    try:
        return int(h[:16], 16) if h else 0
    except ValueError:
        return 0
