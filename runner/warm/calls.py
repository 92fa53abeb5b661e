"""A warm pool's open calls: each call's questions go to the workers under ids of the pool's own
(two calls from two threads may both name a question "0"), and its Future is resolved when the
last of them is answered. This is the pool's answer sink (runner/watch/watch.py AnswerSink), fed
from the pool's loop thread; calls are opened from the callers' threads, and their Futures
resolved on the resolver's (runner/warm/resolver.py), where a done-callback may call the pool.

    call (caller's ids) ─▶ questions as "<call>/<id>" ─▶ workers ─▶ append(answers) ─▶ Future
    an identical prompt in the call: takes its first's answer; a prompt the tokenizer refused: its error
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Mapping, Optional, Sequence

from ...workers.protocol import Answer, Question, Scored
from ..files.formats.rows import Row, row_fields
from ..journal.journal import Expected
from .resolver import Resolver, settle

log = logging.getLogger("ggbatch")


@dataclass(frozen=True)
class Answered:
    """One question's answer, in the order the questions were given."""

    id: str
    text: Optional[str]  # None when the question could not be answered; with samples, the first's
    error: Optional[str] = None
    thinking: Optional[str] = None  # a reasoning model's <think> block, with keep_thinking=True
    choice_logprobs: Optional[dict[str, float]] = None  # with answer={"choices": ..., "logprobs": True}
    scored: Optional[tuple[Scored, ...]] = None  # a scored question's continuations (Pool.submit_questions)
    # with answer={"token_logprobs": K}: per token {token, logprob, bytes, top_logprobs}, as OpenAI's
    token_logprobs: Optional[list[dict[str, Any]]] = None
    samples: Optional[list["Answered"]] = None  # with sampling={"n": N > 1}: each sample, in order
    # the text exactly as generated: not stripped, a thinking block kept (Pool.submit_questions;
    # lm-eval's generate_until returns it so, as its other backends do)
    completion: Optional[str] = None
    # with answer={"choices": ..., "choice_scoring": "loglikelihood"}: lm-eval's acc_norm pick (the
    # choice of the highest log-probability per byte; text is the acc pick), as `ggbatch run` writes it
    answer_norm: Optional[str] = None


# a sample that is null in its question's list (runner/files/formats/rows.py)
SAMPLE_CUT = "cut before its choice or grammar was complete (raise max_tokens)"


def answered(qid: str, fields: Mapping[str, Any]) -> Answered:
    """An Answered from an answers file's fields (runner/files/formats/rows.py row_fields): a
    question's n samples come as lists there, one Answered each here."""
    text = fields.get("answer")
    if not isinstance(text, list):
        return Answered(qid, text, fields.get("error"), fields.get("thinking"), fields.get("choice_logprobs"),
                        token_logprobs=fields.get("token_logprobs"), answer_norm=fields.get("answer_norm"))
    n = len(text)
    thinking, logprobs = fields.get("thinking") or [None] * n, fields.get("token_logprobs") or [None] * n
    samples = [Answered(qid, t, None if t is not None else SAMPLE_CUT, thinking=th, token_logprobs=lp)
               for t, th, lp in zip(text, thinking, logprobs)]
    first = samples[0] if samples else Answered(qid, None)
    return replace(first, samples=samples)


class NoReuse:
    """A warm pool keeps no journal: nothing is reused from an earlier run (runner/questions/maker.py Reuse)."""

    def reuse_records(self, keys: Sequence[int], records: Sequence[int]) -> list[Optional[int]]:
        return [None] * len(keys)

    def reuse_prompt(self, qid: str, prompt: str) -> bool:
        return False

    def expect(self, qid: str, expected: Expected) -> None:
        pass


@dataclass
class Call:
    """One call: its caller's ids in order, and what each takes (its own answer, an identical
    prompt's, or an error made before any worker saw it)."""

    ids: list[str]
    takes: list[str]  # the caller's id of the question whose answer each takes
    future: "Future[list[Answered]]"
    got: dict[str, Answer] = field(default_factory=dict)
    waiting: int = 0
    # told each batch of its questions answered, as the caller's answers (a progress bar, a cache
    # kept as they come), from the pool's loop thread
    on_answered: Optional[Callable[[list[Answered]], None]] = None


class Calls:
    """The open calls, by the pool's question ids."""

    def __init__(self, id_field: str, keep_thinking: bool, withdraw: Callable[[list[str]], None],
                 resolver: Resolver, load_of: Callable[[Question], int]) -> None:
        """withdraw: told the pool's ids of a cancelled call's questions no answer came for yet
        (runner/warm/intake.py Submissions.withdraw: those no worker has are dropped); resolver:
        where the Futures are resolved, off the loop thread (runner/warm/resolver.py); load_of: the
        sequences a question holds while it decodes (runner/warm/intake.py load_of)."""
        self._id_field, self._keep_thinking, self._withdraw = id_field, keep_thinking, withdraw
        self._resolver, self._load_of = resolver, load_of
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        # pool's qid -> (call, the caller's id, the sequences it holds)
        self._open: dict[str, tuple[Call, str, int]] = {}
        self._sequences = 0  # the open questions' sequences, together
        self._ended: Optional[BaseException] = None
        # what the callers were given, one per id of a call (an identical prompt's too), as a job's
        # report counts records: with an answer, with an error (pool.stats())
        self.answered = 0
        self.failed = 0
        # wall time with a question at the workers: a rate over the pool's age would fall while it idles
        self._busy_s = 0.0
        self._busy_since: Optional[float] = None

    def open(self, answered_as: Sequence[tuple[str, str]], questions: Sequence[Question],
             rejected: dict[str, Answer], on_answered: Optional[Callable[[list[Answered]], None]] = None,
             ) -> tuple["Future[list[Answered]]", list[Question]]:
        """A call of these (id, id whose answer it takes) pairs, of which `questions` go to the
        workers: its Future, and the questions under the pool's ids."""
        future: Future[list[Answered]] = Future()
        call = Call([qid for qid, _ in answered_as], [first for _, first in answered_as], future,
                    dict(rejected), len(questions), on_answered)
        prefix = f"{next(self._numbers)}/"
        with self._lock:
            if self._ended is not None:
                raise self._ended
            if questions and not self._open:
                self._busy_since = time.perf_counter()
            for q in questions:
                load = self._load_of(q)
                self._open[prefix + q.qid] = (call, q.qid, load)
                self._sequences += load
        if not questions:  # the caller's own thread: its Future is done when open() returns
            settle(future, self._rows(call))
        sent = [replace(q, qid=prefix + q.qid) for q in questions]
        future.add_done_callback(lambda f: self._cancelled([q.qid for q in sent]) if f.cancelled() else None)
        return future, sent

    def _cancelled(self, qids: list[str]) -> None:
        """A call whose caller cancelled its Future: no answer is waited for, and its questions no
        worker has are not answered (those a worker has are, and their answers dropped)."""
        with self._lock:
            unanswered = [qid for qid in qids if self._forget(qid) is not None]
            if not self._open:
                self._idle()
        self._withdraw(unanswered)

    def append(self, answers: list[Answer]) -> None:
        done: list[Call] = []
        heard: dict[int, tuple[Callable[[list[Answered]], None], list[Answered]]] = {}
        with self._lock:
            for a in answers:
                entry = self._forget(a.qid)
                if entry is None:
                    continue
                call, qid = entry
                call.got[qid] = a
                call.waiting -= 1
                if call.on_answered is not None:
                    heard.setdefault(id(call), (call.on_answered, []))[1].append(self._answered(qid, a))
                if call.waiting == 0:
                    done.append(call)
            if not self._open:
                self._idle()
        for tell, rows in heard.values():
            try:
                tell(rows)
            except Exception:  # the caller's progress bar must not stop the pool's loop
                log.exception("a call's on_answered failed; its answers go on")
        for call in done:
            rows = self._rows(call)
            self._resolver.hand(partial(settle, call.future, rows))

    def _rows(self, call: Call) -> list[Answered]:
        """The call's answers, in its order, counted as given to the caller."""
        rows = [self._answered(qid, call.got.get(first)) for qid, first in zip(call.ids, call.takes)]
        failed = sum(row.error is not None for row in rows)
        with self._lock:
            self.answered += len(rows) - failed
            self.failed += failed
        return rows

    def _answered(self, qid: str, answer: Optional[Answer]) -> Answered:
        """The caller's answer under its own id (None: no answer came back)."""
        fields = row_fields(Row(qid, answer, "no answer came back" if answer is None else answer.error),
                            self._id_field, self._keep_thinking)
        made = answer if answer is not None and answer.error is None else None
        return replace(answered(qid, fields), scored=answer.scored if answer is not None else None,
                       completion=made.text if made is not None else None)

    def one(self, many: "Future[list[Answered]]") -> "Future[Answered]":
        """A call of one question (Pool.submit) as a Future of its answer; cancelling it cancels the call."""
        one: Future[Answered] = Future()

        def done(f: "Future[list[Answered]]") -> None:
            if not one.set_running_or_notify_cancel():
                return  # the caller cancelled: its call was too
            exc = f.exception()
            if exc is not None:
                one.set_exception(exc)
            else:
                one.set_result(f.result()[0])

        one.add_done_callback(lambda f: many.cancel() if f.cancelled() else None)
        many.add_done_callback(done)
        return one

    def end(self, why: BaseException) -> None:
        """No answer will come any more: every open call fails with `why`, and so does every new one."""
        with self._lock:
            self._ended = self._ended or why
            calls = {id(call): call for call, _, _ in self._open.values()}
            self._open.clear()
            self._sequences = 0
            self._idle()
        for call in calls.values():
            self._resolver.hand(partial(settle, call.future, error=why))

    def _forget(self, qid: str) -> Optional[tuple[Call, str]]:
        """(Under the lock) an open question no longer waited for: its call and the caller's id."""
        entry = self._open.pop(qid, None)
        if entry is None:
            return None
        call, caller_id, load = entry
        self._sequences -= load
        return call, caller_id

    def _idle(self) -> None:
        """No question is open any more (under the lock): the time answering stops."""
        if self._busy_since is not None:
            self._busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    @property
    def answering_s(self) -> float:
        """Seconds some question of a call was at the workers, in all."""
        with self._lock:
            since = self._busy_since
            return self._busy_s + (time.perf_counter() - since if since is not None else 0.0)

    @property
    def n_open(self) -> int:
        return len(self._open)

    @property
    def open_sequences(self) -> int:
        """The sequences the open questions hold while they decode (load_of's, together)."""
        return self._sequences

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

