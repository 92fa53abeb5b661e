"""The coordinator's side of tokenizing: a tokenizer process (workers/tokenizer/process.py) holds
the model's vocabulary; prompts stream to it in batches and come back, in order, as tokens or as
the reason the model's tokenizer cannot take them.

    prompts (rendered lazily) ──TokenizeBatch of BATCH_TEXTS──▶ requests queue ──▶ tokenizer process
    tokens | Rejected, in input order ◀── TokenizedBatch ◀── results pipe ◀───────────┘

Tokenizing happens outside the coordinator because llama.cpp's tokenizer can abort the process
on text its vocabulary cannot represent; there, a crash costs one question (see the worker side).

IN_FLIGHT batches per process: the coordinator renders the next batch while the process
tokenizes the last. Requests go through a queue, whose feeder thread does the writing, so the
coordinator never blocks on a full pipe while the process blocks writing its results. Batches
are independent, so several processes can share one stream (round robin, read back in the same
order); one is enough today.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import multiprocess as mp
import psutil
from multiprocess.connection import wait

from ...workers.helper_messages import SpellChoices, TokenizeBatch, TokenizedBatch, TokenizerLoadError, VocabInfo
from ...workers.limits import under_address_space_limit
from ...workers.llama.load_errors import memory_sign
from ...workers.protocol import decode, encode
from ...workers.tokenizer.process import tokenizer_main
from ..child_pipes import FrameReader
from ..child_processes import (
    STATE_HINTS,
    UNGUARDED_MAIN,
    UNGUARDED_MAIN_EXIT,
    exit_reason,
    release_names,
    release_queue,
    start_child,
)
from ..errors import ConfigError, ModelError, WorkerFailure, open_files_limit_named

log = logging.getLogger("ggbatch")

BATCH_TEXTS = 512
IN_FLIGHT = 2
STALL_S = 10.0  # the tokenizer's silence, while it holds a batch, before the log says so (as a worker's)


@dataclass(frozen=True)
class Rejected:
    """A prompt the model's tokenizer cannot take, and why, in words a user understands."""

    reason: str


class _Died(Exception):
    """The tokenizer process is gone; the message says how (exit code or signal, last stderr).
    Out of memory, only the words that say so: the rest of a cut stderr is a traceback's tail, or
    advice that does not apply (numpy's "bad install" for a library it could not map under the limit)."""

    def __init__(self, how: str, words: str) -> None:
        self.memory = memory_sign(words)
        said = self.memory or words
        super().__init__(f"{how}: {said}" if said else how)

    def limit(self) -> str:
        """The address-space limit's words (under_address_space_limit) if it ran out of memory."""
        return under_address_space_limit() if self.memory else ""


class TokenizerProcess:
    """One tokenizer process. `info` (the chat template, special tokens, metadata) is there once
    the constructor returns; a model it cannot load raises ModelError with llama.cpp's reason."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self._start()

    def restart(self) -> None:
        """A new process in place of one that died (killed from outside: the kernel's
        out-of-memory killer); what was submitted to the dead one is lost, and sent again by
        whoever submitted it."""
        self.close()
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        with open_files_limit_named():
            fd, self._stderr_path = tempfile.mkstemp(prefix="ggbatch-tokenizer-", suffix=".log")
            self._stderr = os.fdopen(fd, "rb")  # the process's stderr, read only if it dies
            self._requests = ctx.Queue()
            results, child_end = ctx.Pipe(duplex=False)
        self._results = FrameReader(results)
        self._received: deque[bytes] = deque()  # whole messages read, not yet taken
        self._process = ctx.Process(target=tokenizer_main, name="ggbatch-tokenizer", daemon=True,
                                    args=(self.model_path, self._stderr_path, self._requests, child_end))
        try:
            with open_files_limit_named():
                start_child(self._process)
            child_end.close()  # ours: with the child's copy closed by its death, the pipe says EOF
            self.info = self._handshake()
        except BaseException:
            self.close()
            raise

    def _handshake(self) -> VocabInfo:
        try:
            msg: Union[VocabInfo, TokenizerLoadError] = decode(self._receive())
        except _Died as exc:
            if self._process.exitcode == UNGUARDED_MAIN_EXIT:
                raise ConfigError(UNGUARDED_MAIN) from None
            path = self.model_path
            raise ModelError(f"not enough memory to load the vocabulary of {path} ({exc}){exc.limit()}" if exc.memory
                             else f"{path}: the tokenizer process died loading the vocabulary ({exc})") from None
        finally:
            os.unlink(self._stderr_path)  # the child has it open; no name left behind
            release_names(self._requests)  # so has it its queue's semaphores
        if isinstance(msg, TokenizerLoadError):
            raise ModelError(msg.message)
        return msg

    def submit(self, texts: Sequence[str], add_bos: Sequence[bool]) -> None:
        self._requests.put(encode(TokenizeBatch(tuple(texts), tuple(add_bos))))

    def one_token(self, choices: Sequence[str]) -> tuple[bool, ...]:
        """Whether each choice is one token after the prompt, as a worker finds it (asked with
        no batch in flight: results come back in order)."""
        self._requests.put(encode(SpellChoices(tuple(choices))))
        try:
            single: tuple[bool, ...] = decode(self._receive())
            return single
        except _Died as exc:
            raise WorkerFailure(f"the tokenizer process died ({exc}){exc.limit()}") from None

    def receive(self) -> TokenizedBatch:
        """The result of the oldest batch submitted and not yet received."""
        try:
            batch: TokenizedBatch = decode(self._receive())
            return batch
        except _Died as exc:
            raise WorkerFailure(f"the tokenizer process died ({exc}){exc.limit()}") from None

    def _receive(self) -> bytes:
        """The next message. Waiting on the sentinel too: a dead process is noticed at once, not by a
        hang; and the pipe is read without blocking: one stopped in the middle of a message is a stall."""
        stalled = False
        while not self._received:
            ready = wait([self._results, self._process.sentinel], None if stalled else STALL_S)
            if not ready:  # alive and silent: stopped (SIGSTOP, a debugger), swapping, or a huge batch
                log.warning("the tokenizer process (pid %s) has answered nothing for %.0f s (process state: %s); "
                            "the questions still to make wait for it", self._process.pid, STALL_S, self._state())
                stalled = True
            self._received.extend(self._results.read())
            if not self._received and (self._results.ended or self._process.sentinel in ready):
                self._process.join()
                raise _Died(*self._how_it_died())
        if stalled:
            log.warning("the tokenizer process is answering again")
        return self._received.popleft()

    def _state(self) -> str:
        """The process's state as psutil names it, with what it suggests."""
        try:
            state = psutil.Process(self._process.pid).status()
        except psutil.Error:
            return "gone"
        return state + STATE_HINTS.get(state, "")

    def _how_it_died(self) -> tuple[str, str]:
        how = exit_reason(self._process.exitcode)
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 600))
        return how, " ".join(self._stderr.read().decode("utf-8", "replace").split())[-300:]

    def close(self) -> None:
        """Kill the process (it holds nothing worth finishing); idempotent."""
        if self._process.is_alive():
            self._process.kill()
        if self._process.pid is not None:
            self._process.join()
        release_queue(self._requests)
        self._results.close()
        self._stderr.close()
        if os.path.exists(self._stderr_path):
            os.unlink(self._stderr_path)

    def __enter__(self) -> "TokenizerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class _Sent:
    """A batch in a tokenizer process's hands: kept until its result is read, to send it again
    should the process die."""

    process: TokenizerProcess
    texts: list[str]
    add_bos: list[bool]

    def submit(self) -> None:
        self.process.submit(self.texts, self.add_bos)


def tokenize_all(processes: Sequence[TokenizerProcess], prompts: Iterable[tuple[str, bool]],
                 batch_texts: int = BATCH_TEXTS) -> Iterator[Union[array[int], Rejected]]:
    """The tokens of each (text, add_bos) prompt, or Rejected, in order. `prompts` is consumed a
    batch at a time, so rendering overlaps tokenizing."""
    in_flight: deque[_Sent] = deque()
    turn = itertools.cycle(processes)
    for texts, add_bos in _batches(prompts, batch_texts):
        sent = _Sent(next(turn), texts, add_bos)
        sent.submit()
        in_flight.append(sent)
        if len(in_flight) >= IN_FLIGHT * len(processes):
            yield from _split(_received(in_flight))
    while in_flight:
        yield from _split(_received(in_flight))


def _received(in_flight: deque[_Sent]) -> TokenizedBatch:
    """The result of the oldest batch in flight. A process that died (killed from outside: the
    kernel's out-of-memory killer) is started again and given its batches again, this one
    first and alone; one that dies on it again is given its texts one at a time, so that only a text it dies on
    fails (Rejected), rather than the run ending or looping on it."""
    sent = in_flight.popleft()
    got = _tried(sent)
    if got is None:
        sent.submit()  # alone: a death now is this batch's own, not one given after it
        got = _tried(sent)
        if got is None:
            got = _one_at_a_time(sent)
        for again in in_flight:  # lost with the dead process: sent again, in their order
            if again.process is sent.process:
                again.submit()
    return got


def _tried(sent: _Sent) -> Optional[TokenizedBatch]:
    """The batch's result; None: the process died (it is started again, empty)."""
    try:
        return sent.process.receive()
    except WorkerFailure as exc:
        _restarted(sent.process, exc)
        return None


def _one_at_a_time(sent: _Sent) -> TokenizedBatch:
    """A batch a process died on twice, each text alone: a text it dies on again fails."""
    tokens, counts, errors = array("i"), array("i"), {}
    for i, (text, add_bos) in enumerate(zip(sent.texts, sent.add_bos)):
        sent.process.submit([text], [add_bos])
        try:
            got = sent.process.receive()
        except WorkerFailure as exc:
            _restarted(sent.process, exc)
            counts.append(-1)
            errors[i] = f"the tokenizer process died on it, as twice on its batch ({exc})"
            continue
        tokens.extend(got.tokens)
        counts.extend(got.counts)
        if 0 in got.errors:
            errors[i] = got.errors[0]
    return TokenizedBatch(tokens, counts, errors)


def _restarted(process: TokenizerProcess, died: WorkerFailure) -> None:
    log.warning("%s; starting a new one", died)
    process.restart()


def _batches(prompts: Iterable[tuple[str, bool]], size: int) -> Iterator[tuple[list[str], list[bool]]]:
    texts: list[str] = []
    add_bos: list[bool] = []
    for text, bos in prompts:
        texts.append(text)
        add_bos.append(bos)
        if len(texts) == size:
            yield texts, add_bos
            texts, add_bos = [], []
    if texts:
        yield texts, add_bos


def _split(batch: TokenizedBatch) -> Iterator[Union[array[int], Rejected]]:
    offset = 0
    for i, n in enumerate(batch.counts):
        if n < 0:
            yield Rejected(batch.errors.get(i, "the model's tokenizer could not tokenize it"))
        else:
            yield batch.tokens[offset:offset + n]
            offset += n
