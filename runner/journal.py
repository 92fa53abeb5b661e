"""The journal: every finished answer appended and flushed beside the output, so a run that dies
at 90% loses nothing and a rerun answers only what is missing.

    <output>.journal.jsonl
    line 1   {"ggbatch_journal": 1, "fingerprint": {setting: value, ...}}
    line 2+  {"qid": ..., "prompt": <hash of the prompt tokens>, "record": <hash of its record>,
              "text": ..., ...}   one per answer

The fingerprint holds everything that decides an answer (model identity, prompt and chat
template, sampling, max tokens, ...). A rerun with a different fingerprint is refused, naming the
setting, unless started fresh. An entry is reused only if its prompt hash still matches, so an
edited question under the same id is answered again; a question with settings of its own (an
OpenAI Batch line's max_tokens, temperature, ...) has them in its hash, so editing them on one
line answers that line again.

The journal is also where the answers of a run are kept until the answers file is written from
it (runner/outputs.py): the coordinator holds each answer's place in the file, not the answer. The journal is kept after a complete run:
rerunning the same job then rewrites the same output without answering anything, and a job whose
question file grew answers only the new questions.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from array import array
from dataclasses import dataclass
from dataclasses import asdict
from typing import Any, Mapping, Optional, Sequence

from .columns import HashIndex, IdColumn, text_key
from .config import JobConfig
from .errors import ConfigError, OutputError, quote
from .model import ModelIdentity
from .question_settings import settings_key
from .versions import package_version
from ..workers.protocol import Answer, FinishReason, GenerationParams, Question

VERSION = 1


def prompt_hash(tokens: array, own: Optional[GenerationParams] = None) -> str:
    """Of a question's prompt tokens, and of its own generation settings if it has any."""
    h = hashlib.blake2b(tokens.tobytes(), digest_size=12)
    if own is not None:
        h.update(settings_key(own))
    return h.hexdigest()


def fingerprint(config: JobConfig, model: ModelIdentity, generation: GenerationParams,
                template_sha: str) -> dict[str, Any]:
    """Everything that decides an answer; a journal is reused only when all of it is unchanged."""
    return {"model": model.digest, "model.n_ctx": "auto" if config.n_ctx is None else config.n_ctx,
            "llama_cpp_python": package_version("llama_cpp_python"),
            "chat_template": template_sha, "system": config.system,
            "prompt.template": config.prompt_template, "fields.question": config.question_field,
            # which field is the id (a journal entry is found by it; the default is left out, so
            # that journals written before it was fingerprinted stay valid)
            **({"fields.id": config.id_field} if config.id_field != "questionID" else {}),
            "prompt.template_kwargs": config.template_kwargs,
            "max_tokens": generation.max_tokens, "stop": list(generation.stop),
            "ignore_eos": generation.ignore_eos, "batch_invariant": config.batch_invariant,
            # fixed choices, a schema's or a job's grammar: an answer made under others is not reused
            "answer": asdict(generation.answer) if generation.answer is not None else None,
            # another shard's output holds other questions: refused rather than silently mixed
            "shard": str(config.shard) if config.shard is not None else None,
            **{f"sampling.{k}": v for k, v in asdict(generation.sampling).items()}}


def changed_setting(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[str]:
    """The first setting whose value differs, or None."""
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            return key
    return None


def _entry(answer: Answer, prompt: str, record: str) -> dict[str, Any]:
    return {"qid": answer.qid, "prompt": prompt, "record": record, "text": answer.text,
            "finish_reason": answer.finish_reason.value, "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens, "worker_id": answer.worker_id,
            "ttft_s": round(answer.ttft_s, 4), "latency_s": round(answer.latency_s, 4),
            "error": answer.error, "created": answer.created, "choice_logprobs": answer.choice_logprobs}


def _answer(e: Mapping[str, Any]) -> Answer:
    return Answer(e["qid"], e["text"], FinishReason(e["finish_reason"]), e["prompt_tokens"],
                  e["completion_tokens"], e["worker_id"], e["ttft_s"], e["latency_s"], e["error"],
                  e.get("created", 0.0), e.get("choice_logprobs"))


@dataclass(frozen=True)
class Expected:
    """What a question's entry will say besides its answer."""

    prompt: str  # prompt_hash()
    record: str = ""  # record_hash() of the record it came from


def record_hash(key: int) -> str:
    return f"{key:016x}"


def prompt_key(h: str) -> int:
    """The 64 bits of a hex hash that the indexes keep."""
    try:
        return int(h[:16], 16) if h else 0
    except ValueError:
        return 0


# The start of an entry as _entry writes it: the fields a rerun needs, read without parsing the
# whole line (the answer's text can be long; a million lines are read on a resume).
_HEAD = re.compile(rb'\{"qid": "([^"\\]*)", "prompt": "([0-9a-f]*)", (?:"record": "([0-9a-f]*)", )?"text": ')


def _fields(line: bytes) -> Optional[tuple[str, str, str, bool]]:
    """(qid, prompt hash, record hash, answered without an error) of an entry; None: not one."""
    head = _HEAD.match(line)
    if head is not None:
        # In the JSON text an unescaped quote is never inside a string: the first '"error": '
        # outside the text is the key.
        error = line.find(b', "error": ', head.end())
        if error > 0:  # (an id with a quote or a backslash in it is parsed below)
            return head.group(1).decode(), head.group(2).decode(), (head.group(3) or b"").decode(), \
                line.startswith(b"null", error + 11)
    try:
        e = json.loads(line)
        return e["qid"], e["prompt"], e.get("record", ""), e["error"] is None
    except (ValueError, KeyError, TypeError):
        return None


class Journal:
    def __init__(self, path: str, fingerprint: Mapping[str, Any], fresh: bool = False) -> None:
        self.path = path
        self.fingerprint = dict(fingerprint)
        # The earlier run's entries that may be reused: qid key -> row of the columns below
        self._previous = HashIndex()
        self._prev_record, self._prev_prompt, self._prev_at = array("Q"), array("Q"), array("q")
        self._prev_qids = IdColumn()  # of each row
        self._by_record = HashIndex()  # record hash -> row: a line known before it is parsed
        self.kept = 0  # entries kept from the earlier run
        # qid key -> where this run's answer is in the file (appended, or reused from before)
        self._answers = HashIndex()
        self._expected: dict[str, Expected] = {}  # of the questions being answered now
        try:
            self._open(fresh)
            self._file = open(path, "ab")
            self._size = self._file.tell()
            self._reader = open(path, "rb")
        except OSError as exc:
            raise OutputError(f"{path}: cannot write the journal: {exc.strerror or exc}") from None

    # -- reuse ------------------------------------------------------------------------------------

    def reuse_records(self, keys: Sequence[int], records: Sequence[int]) -> list[Optional[int]]:
        """For each record (its id's key, text_key, and its digest, Record.digest): an earlier
        answer of this very record is the answer of this run now (no need to tokenize the
        question), and its prompt's key (prompt_key) is returned; None: not held. Looked up
        together: a resumed file of millions of records goes through here."""
        rows = self._previous.get_many(keys)
        out: list[Optional[int]] = []
        for key, record, row in zip(keys, records, rows):
            if row is None or row < 0 or not record or self._prev_record[row] != record:
                out.append(None)
                continue
            self._answers.add(key, self._prev_at[row])
            out.append(self._prev_prompt[row])
        return out

    def record_qid(self, record: int) -> Optional[str]:
        """The id of the question whose answer the journal holds for a record written exactly so
        (Record.digest of its line), if any: the line need not even be parsed."""
        row = self._by_record.get(record)
        if row is None:
            return None
        qid = self._prev_qids[row]
        return qid if self._previous.get(text_key(qid)) == row else None  # not since failed or changed

    def reuse_prompt(self, qid: str, prompt: str) -> bool:
        """Whether an earlier answer of this prompt is held (then it is this run's answer)."""
        row = self._previous.get(text_key(qid))
        if row is None or row < 0 or self._prev_prompt[row] != prompt_key(prompt):
            return False
        self._answers.add(text_key(qid), self._prev_at[row])
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
            if self.reuse_prompt(q.qid, h):
                reused[q.qid] = self.answer(q.qid)
            else:
                todo.append(q)
                self.expect(q.qid, Expected(h))
        return todo, reused

    # -- this run's answers -----------------------------------------------------------------------

    def append(self, answers: Sequence[Answer]) -> None:
        """Append answers (those of one worker message) with one write and one flush."""
        lines = []
        at = self._size
        for a in answers:
            expected = self._expected.pop(a.qid, None) or Expected("")
            line = (json.dumps(_entry(a, expected.prompt, expected.record), ensure_ascii=False) + "\n").encode()
            lines.append(line)
            self._answers.add(text_key(a.qid), at)
            at += len(line)
        try:
            self._file.write(b"".join(lines))
            self._file.flush()  # in the kernel's hands now: survives kill -9 of this process
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot append to the journal ({exc.strerror or exc}); "
                              "every answer written before this one is kept") from None
        self._size = at

    def answer(self, qid: str) -> Optional[Answer]:
        """This run's answer to a question (made now or reused), read back from the file."""
        at = self._answers.get(text_key(qid))
        if at is None:
            return None
        self._reader.seek(at)
        e = json.loads(self._reader.readline())
        return _answer(e) if e["qid"] == qid else None  # another id with the same 64-bit key

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

    # -- the earlier run's file ---------------------------------------------------------------------

    def _open(self, fresh: bool) -> None:
        """A new file with the header, or (not fresh, same fingerprint) the earlier run's, its
        entries indexed a line at a time and a torn last line of a killed run cut off, so that
        what is appended never follows half a line."""
        if fresh or not os.path.exists(self.path):
            with open(self.path, "wb") as out:
                out.write((json.dumps({"ggbatch_journal": VERSION, "fingerprint": self.fingerprint}) + "\n").encode())
            return
        with open(self.path, "rb") as old:
            self._check_header(old.readline())
            end = self._index(old, old.tell())
        if end < os.path.getsize(self.path):
            os.truncate(self.path, end)

    def _index(self, old: Any, at: int) -> int:
        """Index the entries from offset `at`; returns where the last whole line ends."""
        for line in old:
            if not line.endswith(b"\n"):
                break  # the last line of a run killed mid-write: that answer is redone
            entry = _fields(line)
            if entry is not None:
                qid, prompt, record, ok = entry
                self.kept += 1
                # A failed answer stays in the file (its story) but is never reused: it is retried.
                self._previous.add(text_key(qid), len(self._prev_at) if ok else -1)
                if ok:
                    if record:
                        self._by_record.add(prompt_key(record), len(self._prev_at))
                    self._prev_qids.append(qid)
                    self._prev_record.append(prompt_key(record))
                    self._prev_prompt.append(prompt_key(prompt))
                    self._prev_at.append(at)
            at += len(line)
        return at

    def _check_header(self, first: bytes) -> None:
        try:
            old = json.loads(first)["fingerprint"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{self.path}: not a ggbatch journal; remove it or run with --fresh") from None
        key = changed_setting(old, self.fingerprint)
        if key is not None:
            raise ConfigError(f"{self.path}: '{key}' changed since the journaled run "
                              f"({quote(old.get(key))} -> {quote(self.fingerprint.get(key))}); "
                              "run with --fresh to start over")
