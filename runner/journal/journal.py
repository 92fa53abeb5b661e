"""The journal: every finished answer appended and flushed beside the output, so a run that dies
at 90% loses nothing and a rerun answers only what is missing.

    <output>.journal.jsonl
    line 1   {"ggbatch_journal": 1, "fingerprint": {setting: value, ...}}
    line 2   {"ggbatch_ran": {"flash_attn": false}}   what it decided on auto (runner/journal/ran.py)
    line 3+  {"qid": ..., "prompt": <hash of the prompt tokens>, "record": <hash of its record>,
              "text": ..., ...}   one per answer

The fingerprint holds everything that decides an answer (model identity, prompt and chat
template, sampling, max tokens, ...). A rerun with a different fingerprint is refused, naming the
setting, unless started fresh. An entry is reused only if its prompt hash still matches, so an
edited question under the same id is answered again; a question with settings of its own (an
OpenAI Batch line's max_tokens, temperature, ...) has them in its hash, so editing them on one
line answers that line again.

The journal is also where the answers of a run are kept until the answers file is written from
it (runner/files/outputs.py): the coordinator holds each answer's place in the file, not the answer.
The journal is kept after a complete run: rerunning the same job then rewrites the same output
without answering anything, and a job whose question file grew answers only the new questions.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from array import array
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ...workers.protocol import Answer, GenerationParams, Question
from ..errors import JournalError, OutputError, StartOver, quote
from ..files.compact import HashIndex, text_key
from ..files.formats.own_settings import settings_key
from .entries import answer_of, entry_of
from .fingerprint import as_written, rule_change, setting_change
from .index import Earlier, holds_answers, prompt_key, read_earlier
from .ran import adopted, as_ran, ran_line, ran_problem

VERSION = 1
PENDING_SUFFIX = ".fresh"  # a fresh run's journal until its first answer (Journal._take_place)


def prompt_hash(tokens: array[int], own: Optional[GenerationParams] = None) -> str:
    """Of a question's prompt tokens, and of its own generation settings if it has any."""
    h = hashlib.blake2b(tokens.tobytes(), digest_size=12)
    if own is not None:
        h.update(settings_key(own))
    return h.hexdigest()


@dataclass(frozen=True)
class Expected:
    """What a question's entry will say besides its answer."""

    prompt: str  # prompt_hash()
    record: str = ""  # record_hash() of the record it came from


def record_hash(key: int) -> str:
    return f"{key:016x}"


class Journal:
    def __init__(self, path: str, fingerprint: Mapping[str, Any], fresh: bool = False,
                 reading: "Optional[Future[Optional[Earlier]]]" = None) -> None:
        """`reading`: the file being read already (runner/journal/index.py start_reading: read
        while the fingerprint was not known yet)."""
        self.path = path
        self.fingerprint = as_written(fingerprint)
        # qid key -> where this run's answer is in the file (appended, or reused from before)
        self._answers = HashIndex()
        self._expected: dict[str, Expected] = {}  # of the questions being answered now
        self._new = False  # made by this run: what it decides on auto is written once (record_ran)
        self._ran_written = False
        # A fresh run's new journal, made beside the earlier one and put in its place with its first
        # answer: a run refused or failed before it answers (a template error in its first window,
        # a context no worker can make) loses nothing.
        self._pending: Optional[str] = None
        try:
            self._earlier = self._open(fresh, reading)  # the earlier run's entries that may be reused
            written = self._pending or path
            # unbuffered: a write that fails part way says how much reached the file (append), and
            # leaves nothing behind in a buffer that a later flush would add after it
            self._file = open(written, "ab", buffering=0)
            self._size = self._file.tell()
            self._reader = open(written, "rb")
        except OSError as exc:
            raise OutputError(f"{path}: cannot write the journal: {exc.strerror or exc}") from None
        self.kept = self._earlier.kept  # entries kept from the earlier run

    # -- reuse ------------------------------------------------------------------------------------

    def reuse_records(self, keys: Sequence[int], records: Sequence[int]) -> list[Optional[int]]:
        """For each record (its id's key, text_key, and its digest, Record.digest): an earlier
        answer of this very record is the answer of this run now (no need to tokenize the
        question), and its prompt's key (prompt_key) is returned; None: not held. Looked up
        together: a resumed file of millions of records goes through here."""
        rows = self._earlier.rows.get_many(keys)
        held = [row if row is not None and row >= 0 and record and self._earlier.records[row] == record else None
                for record, row in zip(records, rows)]
        self._answers.add_many([key for key, row in zip(keys, held) if row is not None],
                               [self._earlier.at[row] for row in held if row is not None])
        return [self._earlier.prompts[row] if row is not None else None for row in held]

    def records_known(self, records: Sequence[int]) -> list[Optional[str]]:
        """For each line's hash (Record.digest of a line as written): the id of the question whose
        answer the journal holds for a record written exactly so, if any, so that the line need
        not even be parsed. Looked up together: a resumed file of millions of lines comes here a
        chunk at a time."""
        qids = self._earlier.qids
        return [None if row is None else qids[row] for row in self._earlier.by_record.get_many(records)]

    def reuse_prompt(self, qid: str, prompt: str) -> bool:
        """Whether an earlier answer of this prompt is held (then it is this run's answer)."""
        row = self._earlier.rows.get(text_key(qid))
        if row is None or row < 0 or self._earlier.prompts[row] != prompt_key(prompt):
            return False
        self._answers.add(text_key(qid), self._earlier.at[row])
        return True

    def expect(self, qid: str, expected: Expected) -> None:
        """This question is to be answered now: its entry will carry these hashes."""
        self._expected[qid] = expected

    def split(self, questions: Sequence[Question]) -> tuple[list[Question], dict[str, Answer]]:
        """(the questions to answer, in their order; qid -> answer reused from the journal). An
        answer is reused if its prompt is unchanged and it did not fail."""
        todo: list[Question] = []
        reused: dict[str, Answer] = {}
        for q in questions:
            h = prompt_hash(q.tokens, q.generation)
            answer = self.answer(q.qid) if self.reuse_prompt(q.qid, h) else None
            if answer is not None:
                reused[q.qid] = answer
            else:
                todo.append(q)
                self.expect(q.qid, Expected(h))
        return todo, reused

    # -- what the run decides on auto --------------------------------------------------------------

    def ran(self, key: str) -> Any:
        """What the journaled run ran for a setting this run leaves on auto (so that this run runs
        the same: runner/journal/ran.py); None for a new journal, or one that does not say."""
        return None if self._new else adopted(self._earlier.fingerprint or {}, self._earlier.ran, key)

    def record_ran(self, ran: Mapping[str, Any]) -> None:
        """Write what this run decided on auto, once, in a journal it made, before any answer. A
        fresh run's journal takes the earlier one's place only with its first answer: one that
        fails before (no worker can make its context) leaves the earlier answers to the next run."""
        if not self._new or self._ran_written or len(self._answers):
            return
        self._check_unchanged()
        line = ran_line(ran)
        try:
            self._write(line)
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot write the journal ({exc.strerror or exc})") from None
        self._size += len(line)
        self._ran_written = True

    # -- this run's answers -----------------------------------------------------------------------

    def append(self, answers: Sequence[Answer]) -> None:
        """Append answers (those of one worker message) with one write; each is this run's answer
        once its line is in the file. A write that fails part way (a full disk, ulimit -f) still
        keeps the lines before the cut: a rerun resumes from them, so the answers file has them too.
        The cut line left after them is dropped by the rerun (runner/journal/index.py read_entries)."""
        lines, places = [], []
        at = self._size
        for a in answers:
            expected = self._expected.pop(a.qid, None) or Expected("")
            line = (json.dumps(entry_of(a, expected.prompt, expected.record), ensure_ascii=False) + "\n").encode()
            lines.append(line)
            at += len(line)
            places.append((text_key(a.qid), at - len(line), at))
        self._check_unchanged()
        done = [0]  # the bytes of these lines that reached the file
        error: Optional[OSError] = None
        try:
            self._take_place()
            self._write(b"".join(lines), done)  # in the kernel's hands now: survives kill -9 of this process
        except OSError as exc:
            error = exc  # said below, once the lines before it are kept
        reached = self._size + done[0]
        for key, place, end in places:
            if end <= reached:  # whole in the file
                self._answers.add(key, place)
                self._size = end
        if error is not None:
            raise JournalError(f"{self.path}: cannot append to the journal ({error.strerror or error}); every answer "
                               "written before this one is kept: make room, then run the same command again to "
                               "finish") from None

    def _write(self, data: bytes, done: Optional[list[int]] = None) -> None:
        """All of `data` to the file, or OSError; `done[0]` counts the bytes that reached it (a
        write may take part of them before the next one fails)."""
        done = [0] if done is None else done
        view = memoryview(data)
        while done[0] < len(data):
            n = self._file.write(view[done[0]:])
            if not n:  # only a non-blocking file says None; 0 would never end
                raise OSError(errno.EIO, "the journal took none of a write")
            done[0] += n

    def _take_place(self) -> None:
        """The run has its first answer: a fresh journal replaces the earlier one (the open files follow it)."""
        if self._pending is not None:
            os.replace(self._pending, self.path)
            self._pending = None

    def _check_unchanged(self) -> None:
        """The file still ends where this run's last append did. Cut short or written to by another
        program, it would take the next answers at places the run does not know. (Removed or
        replaced, the file this run holds open goes on working: the answers file is still written whole.)"""
        if os.fstat(self._file.fileno()).st_size != self._size:
            raise JournalError(f"{self.path}: the journal was cut short or written to by another program during "
                               "the run; the answers it no longer holds are lost: run the same command again to "
                               "answer them")

    def answer(self, qid: str) -> Optional[Answer]:
        """This run's answer to a question (made now or reused), read back from the file; None
        where the file no longer holds it (cut short by another program)."""
        at = self._answers.get(text_key(qid))
        if at is None:
            return None
        self._reader.seek(at)
        try:
            e = json.loads(self._reader.readline())
        except ValueError:
            return None
        return answer_of(e) if isinstance(e, dict) and e.get("qid") == qid else None  # another id with the same key

    def sync(self) -> None:
        """Make what was appended survive a power cut too (a killed process loses nothing anyway)."""
        try:
            os.fsync(self._file.fileno())
        except OSError:
            pass

    def close(self) -> None:
        self.sync()
        for f in (self._file, self._reader):
            try:
                f.close()
            except OSError:
                pass  # a failed append has already said so; everything flushed before it is kept
        if self._pending is not None:  # never begun: the earlier journal stays as it was
            with contextlib.suppress(OSError):
                os.unlink(self._pending)

    # -- the earlier run's file ---------------------------------------------------------------------

    def _open(self, fresh: bool, reading: "Optional[Future[Optional[Earlier]]]") -> Earlier:
        """A new file with the header, or (not fresh, same fingerprint) the earlier run's,
        indexed, and a torn last line of a killed run cut off, so that what is appended never
        follows half a line. An earlier journal holding no answer (a run refused for its input
        after the header was written, or whose every answer failed) is replaced whatever its
        settings: nothing in it can be lost, and the setting it names was often the fix."""
        with contextlib.suppress(OSError):  # one a run killed before it began left (the output's lock is held)
            os.unlink(self.path + PENDING_SUFFIX)
        earlier = None if fresh else reading.result() if reading is not None else read_earlier(self.path)
        if earlier is None or not holds_answers(earlier):
            if fresh and os.path.exists(self.path):
                self._pending = self.path + PENDING_SUFFIX
            with open(self._pending or self.path, "wb") as out:
                out.write((json.dumps({"ggbatch_journal": VERSION, "fingerprint": self.fingerprint}) + "\n").encode())
            self._new = True
            return Earlier(self.fingerprint)
        self._check_header(earlier.fingerprint, earlier.ran)
        if earlier.end < os.path.getsize(self.path):
            os.truncate(self.path, earlier.end)
        return earlier

    def _check_header(self, old: Optional[dict[str, Any]], ran: Optional[dict[str, Any]]) -> None:
        if old is None:
            raise StartOver(f"{self.path}: not a ggbatch journal", "remove it or {how}")
        problem = ran_problem(ran)
        if problem is not None:
            raise StartOver(f"{self.path}: {problem}", "remove that line (its answers are then taken for a "
                            "version's before that line), or {how} to start over")
        change = setting_change(as_ran(old, ran, self.fingerprint), self.fingerprint)
        if change is not None:
            key, was, now = change
            said = rule_change(key, was, now) or (f"'{key}' changed since the journaled run "
                                                  f"({quote(was)} -> {quote(now)})")
            raise StartOver(f"{self.path}: {said}", "{how} to start over")
