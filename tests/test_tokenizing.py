"""Tokenizing where llama.cpp may crash: a text its tokenizer cannot take costs that text only.

On a real vocabulary that cannot take every character (TinyStories-656K has neither a token nor
a byte token for ’, “, {, ...: llama.cpp throws std::out_of_range and the process aborts), through
the real tokenizer process; and on a fake tokenizer with the real tokenizer interface that
crashes the other ways a C library can, through the real fork. Every test that starts processes
has a hard timeout."""

import contextlib
import ctypes
import faulthandler
import fcntl
import itertools
import logging
import os
import signal
import struct
import termios
import threading
import time
from array import array
from pathlib import Path

import pytest

from conftest import MODELS, require
from ggbatch.runner.errors import ModelError
from ggbatch.runner.questions.tokenizing import Rejected, TokenizerProcess, tokenize_all
from ggbatch.workers.llama.vocab_gaps import SpmGaps
from ggbatch.workers.tokenizer.fork import MIN_CAPACITY
from ggbatch.workers.tokenizer.process import BatchTokenizer
from helpers import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.model]

TINY = MODELS / "TinyStories-656K-Q8_0.gguf"
NO_TOKEN = "the model's vocabulary has no token for {} (and no byte fallback)"
GOOD = ["Once upon a time, there was a little cat.", "Lily liked to play in the park with Tom.",
        "The sun was hot and the sky was blue!", "\"Can I have the red ball?\" asked Ben.",
        "They ate 3 apples and 12 pears.", "One day, a big dog came to the house."]
BAD = {"It’s a dog.": "U+2019 ’", "A “big” day": "U+201C “, U+201D ”", "Tom said {hi}": "U+007B {, U+007D }",
       "Mom’s café": "U+2019 ’, U+00E9 é", "一二三四五六": "U+4E00 一, U+4E8C 二, U+4E09 三, U+56DB 四, "
                                                     "U+4E94 五 and 1 more characters"}


@pytest.fixture(scope="module")
def tiny():
    tiny = require(TINY, "TinyStories' tokenizer, which lacks characters (and aborts on them without ggbatch's check)")
    with TokenizerProcess(str(tiny)) as process:
        yield process


def expected_tokens(texts, add_bos):
    """In-process tokenization, for the texts llama.cpp can take (the others would abort pytest)."""
    from ggbatch.workers.llama.model_runner import Tokenizer

    tokenizer = Tokenizer(str(TINY))
    try:
        return [tokenizer.tokenize(t, b) for t, b in zip(texts, add_bos)]
    finally:
        tokenizer.close()


def test_bad_texts_are_rejected_where_they_are_and_the_rest_tokenize_as_in_process(tiny):
    bad = list(BAD)
    # Bad texts first, last, side by side, and on both sides of batch boundaries (batches of 4).
    texts = [bad[0], GOOD[0], GOOD[1], bad[1], bad[2], GOOD[2], GOOD[3], bad[3], GOOD[4], "\ud800 half",
             GOOD[5], GOOD[0] + " " + GOOD[1], bad[4]]
    add_bos = [i % 3 != 0 for i in range(len(texts))]
    got = list(tokenize_all([tiny], zip(texts, add_bos), batch_texts=4))
    assert len(got) == len(texts)
    good = [i for i, t in enumerate(texts) if t not in BAD and "\ud800" not in t]
    for i, t in enumerate(texts):
        if t in BAD:
            assert got[i] == Rejected(NO_TOKEN.format(BAD[t])), i
    assert got[9] == Rejected("not valid Unicode text: U+D800 at character 1 is half of a surrogate pair")
    assert [got[i] for i in good] == expected_tokens([texts[i] for i in good], [add_bos[i] for i in good])
    assert all(isinstance(got[i], array) and got[i].typecode == "i" for i in good)


def test_hundreds_of_bad_records_cost_neither_a_process_nor_a_fork_each(tiny):
    texts = [f"It’s dog number {i}." if i % 2 else f"It is dog number {i}." for i in range(600)]
    pid = tiny._process.pid
    t0 = time.perf_counter()
    got = list(tokenize_all([tiny], ((t, True) for t in texts)))
    elapsed = time.perf_counter() - t0
    assert [isinstance(g, Rejected) for g in got] == [i % 2 == 1 for i in range(600)]
    assert all(g.reason == NO_TOKEN.format("U+2019 ’") for g in got[1::2])
    assert tiny._process.pid == pid and tiny._process.is_alive()
    # One crash teaches the tokenizer process that ’ aborts; without that, a fork per record is
    # ~8 ms, a new process importing llama.cpp per record 0.2 s, a gdb backtrace per abort
    # (GGML_NO_BACKTRACE unset) a second.
    assert elapsed < 20, f"{elapsed:.1f} s"


def test_batches_shared_by_two_processes_come_back_in_order(tiny):
    texts = [(GOOD + list(BAD))[i % 11] + f" {i}" for i in range(50)]
    with TokenizerProcess(str(TINY)) as other:
        assert list(tokenize_all([tiny, other], ((t, True) for t in texts), batch_texts=3)) == \
            list(tokenize_all([tiny], ((t, True) for t in texts)))


class KilledOn(TokenizerProcess):
    """A real tokenizer process killed from outside (SIGKILL, as the out-of-memory killer does)
    every time it is given a batch holding `text`, the first `times` times."""

    def __init__(self, model_path: str, text: str, times: int) -> None:
        self.text, self.times = text, times
        super().__init__(model_path)

    def submit(self, texts, add_bos):
        super().submit(texts, add_bos)
        if self.text in texts and self.times > 0:
            self.times -= 1
            os.kill(self._process.pid, signal.SIGKILL)


@pytest.mark.parametrize("times", [1, 2])
def test_a_tokenizer_process_killed_from_outside_is_started_again_and_its_batches_sent_again(times):
    """Killed once, or twice on the same batch: a new process tokenizes it (and the batch in
    flight after it), each text as an untouched process does."""
    texts = [f"{GOOD[i % len(GOOD)]} {i}" for i in range(12)]
    with KilledOn(str(require(TINY)), texts[4], times) as process:
        first = process._process.pid
        got = list(tokenize_all([process], ((t, True) for t in texts), batch_texts=3))
        assert process._process.pid != first and process._process.is_alive()
    assert got == expected_tokens(texts, [True] * len(texts))


class StoppedOn(TokenizerProcess):
    """A tokenizer process stopped (SIGSTOP) as it is given a text, and let go on after `for_s`."""

    def __init__(self, model_path: str, text: str, for_s: float) -> None:
        self.text, self.for_s = text, for_s
        super().__init__(model_path)

    def submit(self, texts, add_bos):
        if self.text in texts:
            os.kill(self._process.pid, signal.SIGSTOP)
            threading.Timer(self.for_s, os.kill, (self._process.pid, signal.SIGCONT)).start()
        super().submit(texts, add_bos)


def test_a_stopped_tokenizer_process_is_said_with_its_state_then_said_to_answer_again(monkeypatch, caplog):
    monkeypatch.setattr("ggbatch.runner.questions.tokenizing.STALL_S", 0.5)
    # Heard at the ggbatch logger itself: a CLI run in this process sets its level and propagation.
    logger = logging.getLogger("ggbatch")
    logger.addHandler(caplog.handler)
    texts = [f"{GOOD[i % len(GOOD)]} {i}" for i in range(6)]
    try:
        with caplog.at_level(logging.WARNING, logger="ggbatch"), \
                StoppedOn(str(require(TINY)), texts[0], for_s=2.0) as process:
            got = list(tokenize_all([process], ((t, True) for t in texts), batch_texts=3))
    finally:
        logger.removeHandler(caplog.handler)
    assert got == expected_tokens(texts, [True] * len(texts))
    # a record may reach caplog's handler twice in a row: here and through the root logger
    messages = (r.getMessage() for r in caplog.records if "tokenizer process" in r.getMessage())
    said = [m for m, _ in itertools.groupby(messages)]
    stall = f"the tokenizer process (pid {process._process.pid}) has answered nothing for 0 s (process state: "
    again = "the tokenizer process is answering again"
    stopped = said.index(stall + "stopped: SIGSTOP or a debugger? SIGCONT resumes it); the questions still to make "
                         "wait for it")
    assert said[stopped + 1:] == [again], said
    # before it, on a loaded machine, a batch may take longer than the 0.5 s here while running
    assert all(m in (stall + "running); the questions still to make wait for it", again) for m in said[:stopped]), said


def _bytes_waiting(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def test_a_tokenizer_process_stopped_in_the_middle_of_a_long_result_is_a_stall(monkeypatch, caplog):
    """A result far longer than the pipe's buffer: stopped while writing it, the process is said
    to be stalled, where a blocking read of the result waited in silence."""
    monkeypatch.setattr("ggbatch.runner.questions.tokenizing.STALL_S", 0.5)
    logger = logging.getLogger("ggbatch")
    logger.addHandler(caplog.handler)
    texts = [f"{' '.join(GOOD * 4)} {i}" for i in range(1000)]
    try:
        with caplog.at_level(logging.WARNING, logger="ggbatch"), TokenizerProcess(str(require(TINY))) as process:
            process.submit(texts, [True] * len(texts))
            fd = process._results.fileno()
            wait_for(lambda: _bytes_waiting(fd) > 0, 30, "the result begun")
            time.sleep(0.3)  # the buffer full, the process waits to write the rest
            os.kill(process._process.pid, signal.SIGSTOP)
            threading.Timer(2.0, os.kill, (process._process.pid, signal.SIGCONT)).start()
            got = process.receive()
    finally:
        logger.removeHandler(caplog.handler)
    assert len(got.counts) == len(texts) and -1 not in got.counts
    said = [r.getMessage() for r in caplog.records]
    assert any("has answered nothing for 0 s (process state: stopped" in m for m in said), said
    assert "the tokenizer process is answering again" in said


def test_a_text_the_tokenizer_process_keeps_dying_on_fails_alone():
    """Killed each time it is given one text: after two deaths on its batch the texts go one at a
    time; that text fails (Rejected), the others tokenize, nothing loops."""
    texts = [f"{GOOD[i % len(GOOD)]} {i}" for i in range(9)]
    with KilledOn(str(require(TINY)), texts[4], times=100) as process:
        got = list(tokenize_all([process], ((t, True) for t in texts), batch_texts=3))
        # killed given its batch (in flight behind the first, which it took down), alone again,
        # then given the text alone: 4 kills, none more
        assert process.times == 96
    assert isinstance(got[4], Rejected) and got[4].reason.startswith("the tokenizer process died on it")
    assert [g for i, g in enumerate(got) if i != 4] == expected_tokens(texts[:4] + texts[5:], [True] * 8)


def test_the_vocabulary_info_is_the_models(tiny):
    info = tiny.info
    assert info.n_vocab == 2048 and info.n_ctx_train == 512 and info.chat_template is None
    assert info.bos_text == "<|start_story|>" and info.metadata["general.architecture"] == "llama"
    assert info.metadata["llama.block_count"] == "2"


def test_a_model_the_tokenizer_process_cannot_load_is_a_model_error(tmp_path, demo_model):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(Path(demo_model).read_bytes()[:600_000])
    with pytest.raises(ModelError, match=r"truncated\.gguf: the model file is truncated or corrupt \(tensor"):
        TokenizerProcess(str(truncated))


UNDER_A_LIMIT = """
import resource, sys
from ggbatch.runner.errors import ModelError
from ggbatch.runner.questions.tokenizing import TokenizerProcess
limit = int(sys.argv[2]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # here, not before: the tokenizer process, not this one
try:
    TokenizerProcess(sys.argv[1]).close()
except ModelError as exc:
    print(exc)
"""


@pytest.mark.parametrize("mib", [78, 117])  # here: numpy's libraries cannot be mapped; a MemoryError in an import
def test_a_tokenizer_process_out_of_memory_under_ulimit_v_says_so_naming_the_limit(demo_model, mib):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", UNDER_A_LIMIT, demo_model, str(mib)], capture_output=True, text=True,
                       timeout=60)
    said = r.stdout.strip()
    assert said.startswith(f"not enough memory to load the vocabulary of {demo_model} (exit code 1: "), \
        r.stdout + r.stderr
    # the words that say memory, not a traceback's tail or numpy's advice on a bad install
    assert said.endswith(f") under the address-space limit of {mib} MiB per process (ulimit -v): raise or remove "
                         "the limit") and "\n" not in said, said
    assert "File " not in said and "install" not in said, said


# -- which characters an SPM vocabulary lacks --------------------------------------------------------

PIECES = {b"a", b"b", b"\xe2\x96\x81", b"<0x41>", b"<0xC3>", b"x\xe2\x80\x99s"}  # ▁, and x’s


def test_a_character_is_unknown_without_a_token_or_byte_tokens_for_all_its_bytes():
    gaps = SpmGaps(PIECES)
    # "A" has byte token <0x41>; "é" is C3 A9 and only C3 has one; ’ has a token only inside x’s.
    assert gaps.unknown("ab A é’ é") == ["é", "’"]
    assert gaps.certain("ab A é’ é") == ["é"]  # ’ might be merged into x’s; é never can
    assert SpmGaps({b"a"}).unknown("a a") == [" "]  # a space is U+2581 to SPM


# -- the fork, with fake tokenizers that crash -------------------------------------------------------


class CrashingTokenizer:
    """The tokenizer interface of the tokenizer process (model_runner.Tokenizer's tokenize_into
    and gaps): one token per byte, times `per_byte`; crashes on marker words."""

    def __init__(self, per_byte: int = 1) -> None:
        self.per_byte = per_byte

    def tokenize_into(self, data: bytes, add_bos: bool, out_address: int, capacity: int) -> int:
        faulthandler.disable()  # in the fork: pytest's handler would print its Python stack on a crash
        if b"ABORT" in data:
            os.abort()
        if b"SEGV" in data:
            os.kill(os.getpid(), signal.SIGSEGV)
        if b"RAISE" in data:
            raise RuntimeError("a bug")
        tokens = array("i", [1] * add_bos + [b for b in data for _ in range(self.per_byte)])
        if len(tokens) > capacity:
            return -len(tokens)
        ctypes.memmove(out_address, tokens.tobytes(), 4 * len(tokens))
        return len(tokens)

    def gaps(self):
        return None


class SpmLikeTokenizer(CrashingTokenizer):
    """Aborts as llama.cpp does on a character it can neither merge nor spell in bytes (it never
    merges here: the vocabulary's x’s is never formed), saying so on stderr."""

    def __init__(self) -> None:
        super().__init__()
        self._gaps = SpmGaps(PIECES)

    def tokenize_into(self, data: bytes, add_bos: bool, out_address: int, capacity: int) -> int:
        if self._gaps.unknown(data.decode()):
            faulthandler.disable()
            os.write(2, b"terminate called after throwing an instance of 'std::out_of_range'\n")
            os.abort()
        return super().tokenize_into(data, add_bos, out_address, capacity)

    def gaps(self):
        return self._gaps


@contextlib.contextmanager
def stderr_to(path):
    """The fork's stderr is a file in the tokenizer process (its dying words are read back). Set
    in the test itself: pytest's capture takes fd 2 back between a fixture and the test."""
    saved = os.dup(2)
    with open(path, "a+b") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def tokenize(tokenizer, texts, add_bos, stderr):
    with stderr_to(stderr):
        batches = BatchTokenizer(tokenizer)
        try:
            return batches.tokenize(texts, add_bos)
        finally:
            batches.close()


def test_any_crash_costs_only_its_text(tmp_path):
    texts = ["ab", "ABORT", "cd", "SEGV", "RAISE", "ef"]
    batch = tokenize(CrashingTokenizer(), texts, [False] * len(texts), tmp_path / "stderr")
    assert list(batch.counts) == [2, -1, 2, -1, -1, 2]
    assert list(batch.tokens) == [ord(c) for c in "abcdef"]
    assert batch.errors[1].startswith("llama.cpp's tokenizer aborted on this prompt")
    assert batch.errors[3] == "llama.cpp's tokenizer crashed (Segmentation fault) on this prompt"
    assert batch.errors[4].startswith("llama.cpp's tokenizer failed (exit code 70) on this prompt")


def test_after_a_crash_texts_with_a_character_that_certainly_aborts_are_rejected_without_a_fork(tmp_path):
    texts = ["ab", "é a", "b", "a é", "a’", "é", "b ’", "ba"]
    batch = tokenize(SpmLikeTokenizer(), texts, [False] * len(texts), tmp_path / "stderr")
    assert [i for i, n in enumerate(batch.counts) if n < 0] == [1, 3, 4, 5, 6]
    assert [batch.errors[i] for i in (1, 3, 5)] == [NO_TOKEN.format("U+00E9 é")] * 3
    assert [batch.errors[i] for i in (4, 6)] == [NO_TOKEN.format("U+2019 ’")] * 2
    # One crash for é (then known), one for each text with ’ (a token holds it: maybe merged).
    assert (tmp_path / "stderr").read_text().count("terminate called") == 3


def test_a_text_with_more_tokens_than_room_goes_on_in_a_bigger_area(tmp_path):
    big = "x" * (MIN_CAPACITY // 2)  # 1.5 × MIN_CAPACITY tokens, from an estimate of 0.5 ×
    batch = tokenize(CrashingTokenizer(per_byte=3), ["ab", big, "c"], [True, True, False], tmp_path / "stderr")
    assert list(batch.counts) == [7, 3 * len(big) + 1, 3] and not batch.errors
    assert batch.tokens[:7] == array("i", [1] + [ord("a")] * 3 + [ord("b")] * 3)
    assert batch.tokens[-3:] == array("i", [ord("c")] * 3)
