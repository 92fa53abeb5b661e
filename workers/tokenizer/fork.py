"""A fork of the tokenizer process that tokenizes into shared memory, so that llama.cpp may crash.

    tokenizer process                                 fork (vocabulary inherited, loaded already)
        │ ── requests pipe: texts of a round ─────────▶ │  for each text i: llama_tokenize into
        │                                               │    shared memory, its count, DONE = i + 1
        │ ◀────────────────────── done pipe: b"" ────── │
        │    or EOF: it died on text DONE; what it did before is in shared memory

llama.cpp's tokenizer aborts the process on text its vocabulary cannot represent (an SPM
vocabulary without byte tokens throws std::out_of_range from llama_vocab::byte_to_token; a C++
exception reaching ctypes is std::terminate). A fork has the vocabulary loaded already, so a crash
costs a new fork: 3-9 ms here (2 busy cores, up to the 152k-token Qwen2 vocabulary), where a new
process importing llama.cpp and loading the vocabulary again takes 0.2-0.6 s. The fork lives on
from round to round (a fork for every batch of 512 prompts made tokenizing 20,000 of them 1.7×
slower) and is replaced only when it dies or needs more room.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
from dataclasses import dataclass
from typing import Any, NoReturn, Optional, Sequence

from multiprocess.connection import Pipe

from ..main import die_with_parent

PR_SET_DUMPABLE = 4  # from <linux/prctl.h>
SPARE_TOKENS = 8  # room per text beyond one token per byte: BOS, EOS
MIN_CAPACITY = 1 << 20  # ints of shared memory (4 MiB): a batch of typical prompts fits many times
LAST_WORDS = 2048  # bytes of a dead fork's stderr kept for the error message
FORK_FAILED = 70  # exit code of a fork that hit a Python error (as fatal as a crash in llama.cpp)


def capacity_for(data: Sequence[Optional[bytes]]) -> int:
    """Ints of shared memory a round needs: each text's count, and its tokens, at most one per
    byte plus BOS/EOS (a normalizer that lengthens text may need more: the round then stops at
    that text, and the next round gets a bigger area)."""
    return sum(1 + (len(d) + SPARE_TOKENS if d is not None else 0) for d in data)


class _Shared:
    """Anonymous shared memory, inherited by the fork: a header, then each text's token count,
    then the tokens of all texts one after the other."""

    # Header: texts done (so text DONE is the one a dead fork was on), tokens written, and the
    # tokens a text that did not fit needs.
    DONE, USED, NEEDED = range(3)
    HEADER = 3

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._mm = mmap.mmap(-1, 4 * (self.HEADER + capacity))
        self.ints = memoryview(self._mm).cast("i")
        self._anchor = ctypes.c_char.from_buffer(self._mm)  # gives the address llama.cpp writes to
        self.address = ctypes.addressof(self._anchor) + 4 * self.HEADER

    def close(self) -> None:
        del self._anchor
        self.ints.release()
        self._mm.close()


@dataclass(frozen=True)
class Round:
    """What a round got done: counts[i] tokens of texts[i] for i < done, all in `tokens`."""

    done: int
    counts: list[int]
    tokens: bytes  # int32s
    died: int = 0  # wait status when the fork died on text `done`, else 0
    last_words: bytes = b""  # what it wrote to stderr before dying
    needed: int = 0  # tokens text `done` needs, when it did not fit


class TokenizingFork:
    """The tokenizer process's side: send a round of texts, get a Round back; fork again as needed."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pid = 0
        self.shared: Optional[_Shared] = None
        self._requests: Any = None
        self._done: Any = None

    def run(self, data: Sequence[Optional[bytes]], add_bos: Sequence[bool], room: int = 0) -> Round:
        """Tokenize data (None: skip) until done, a crash, or a text that does not fit; `room`:
        tokens needed beyond the estimate (what the text that did not fit last time needs)."""
        need = capacity_for(data) + room
        if self.pid and os.waitpid(self.pid, os.WNOHANG)[0]:  # killed between rounds: not a text's fault
            self._forget()
        shared = self.shared
        if not self.pid or shared is None or need > shared.capacity:
            shared = self._start(need)
        ints = shared.ints
        ints[_Shared.DONE] = ints[_Shared.USED] = ints[_Shared.NEEDED] = 0
        stderr_at = os.lseek(2, 0, os.SEEK_END)
        try:
            self._requests.send_bytes(pickle.dumps((data, add_bos), pickle.HIGHEST_PROTOCOL))
            self._done.recv_bytes()
            died = 0
        except (EOFError, BrokenPipeError, ConnectionResetError):
            died = os.waitpid(self.pid, 0)[1] or FORK_FAILED << 8  # (a wait status of 0 is no death)
            self._forget()
        return self._collect(shared, len(data), died, _last_words(stderr_at) if died else b"")

    def _collect(self, shared: _Shared, n: int, died: int, last_words: bytes) -> Round:
        ints = shared.ints
        done = ints[_Shared.DONE]
        counts = ints[_Shared.HEADER:_Shared.HEADER + done].tolist()
        start = _Shared.HEADER + n
        return Round(done, counts, ints[start:start + ints[_Shared.USED]].tobytes(), died, last_words,
                     ints[_Shared.NEEDED])

    def _start(self, need: int) -> _Shared:
        """A new fork, with shared memory of at least `need` tokens (the old one when it is enough)."""
        self._stop()
        shared = self.shared
        if shared is None or need > shared.capacity:
            if shared is not None:
                shared.close()
            shared = self.shared = _Shared(max(MIN_CAPACITY, need))
        requests_r, self._requests = Pipe(duplex=False)
        self._done, done_w = Pipe(duplex=False)
        self.pid = os.fork()
        if self.pid == 0:
            self._requests.close()
            self._done.close()
            _fork_main(self.tokenizer, shared, requests_r, done_w)
        requests_r.close()  # only the fork holds these ends now: its death reads as EOF here
        done_w.close()
        return shared

    def _forget(self) -> None:
        """The fork is gone (reaped): close our ends of its pipes."""
        self._requests.close()
        self._done.close()
        self.pid = 0

    def _stop(self) -> None:
        if self.pid:
            self._requests.close()  # the fork exits when its requests pipe closes
            os.waitpid(self.pid, 0)
            self._forget()

    def close(self) -> None:
        self._stop()
        if self.shared is not None:
            self.shared.close()
            self.shared = None


def _last_words(offset: int) -> bytes:
    """What the dead fork wrote to stderr (fd 2, a file) since `offset`, its last LAST_WORDS bytes."""
    end = os.lseek(2, 0, os.SEEK_END)
    return os.pread(2, min(end - offset, LAST_WORDS), max(offset, end - LAST_WORDS))


def _fork_main(tokenizer: Any, shared: _Shared, requests: Any, done: Any) -> NoReturn:
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_DUMPABLE, 0)  # no core dump per crash: a bad file may crash thousands of forks
        die_with_parent()
        while True:
            data, add_bos = pickle.loads(requests.recv_bytes())
            _tokenize_round(tokenizer, shared, data, add_bos)
            done.send_bytes(b"")
    except EOFError:  # the tokenizer process closed the pipe: done
        os._exit(0)
    except BaseException:  # a Python error here is as fatal as llama.cpp's: blame the current text
        os._exit(FORK_FAILED)


def _tokenize_round(tokenizer: Any, shared: _Shared, data: Sequence[Optional[bytes]],
                    add_bos: Sequence[bool]) -> None:
    ints, n, used = shared.ints, len(data), 0
    room = shared.capacity - n
    base = shared.address + 4 * n
    for i, text in enumerate(data):
        ints[_Shared.HEADER + i] = -1
        if text is not None:
            count = tokenizer.tokenize_into(text, add_bos[i], base + 4 * used, room - used)
            if count < 0:
                ints[_Shared.NEEDED] = -count
                return
            ints[_Shared.HEADER + i] = count
            used += count
            ints[_Shared.USED] = used
        ints[_Shared.DONE] = i + 1
