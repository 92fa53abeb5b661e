"""The tokenizer process: the model's vocabulary, answering batches of prompts with their tokens.

    requests (TokenizeBatch) ──▶ UTF-8 ──▶ TokenizingFork.run ──▶ TokenizedBatch ──▶ results
                                                │ died on text k: k gets an error (the characters the
                                                │ vocabulary lacks, else llama.cpp's last words on
                                                └─ stderr), a new fork goes on from k + 1

No text is tokenized in this process itself, only in a fork of it (workers/tokenizer/fork.py):
llama.cpp's tokenizer may abort on text its vocabulary cannot represent. This process stays
single-threaded (it reads the requests queue and writes the results pipe, no feeder thread), so
forking it is safe.

A crash costs a fork (3-9 ms). So that a file in a script the vocabulary lacks, with
thousands of bad records, does not cost thousands of forks, the characters a crash was certainly
due to (workers/llama/vocab_gaps.py: no token holds them, no byte tokens spell them) are remembered,
and later texts holding one are rejected without tokenizing. Learned from crashes, not predicted:
a llama.cpp build that stops aborting on them never rejects a text it could tokenize.
"""

from __future__ import annotations

import ctypes
import os
import signal
from array import array
from typing import Any, Optional, Sequence, Union

from ..helper_messages import SpellChoices, TokenizeBatch, TokenizedBatch, TokenizerLoadError
from ..main import die_with_parent, leave_signals_to_parent
from ..protocol import decode, encode
from .fork import Round, TokenizingFork

PR_SET_NAME = 15  # from <linux/prctl.h>
PROCESS_NAME = b"ggbatch-tokenizer"  # seen as "ggbatch-tokeniz"


def tokenizer_main(model_path: str, stderr_path: str, requests: Any, results: Any) -> None:
    """Entry point of the tokenizer process: load the vocabulary, then answer TokenizeBatch
    requests until killed. stderr goes to `stderr_path`, where the coordinator reads it if this
    process dies and where this process reads a dead fork's last words."""
    leave_signals_to_parent()
    die_with_parent()
    _name_process(PROCESS_NAME)
    fd = os.open(stderr_path, os.O_RDWR | os.O_APPEND)  # read back too: a dead fork's last words
    os.dup2(fd, 2)
    os.close(fd)
    # Read when libggml loads: without it, every abort forks gdb to print a backtrace (seconds).
    os.environ["GGML_NO_BACKTRACE"] = "1"
    from ..llama.load_errors import ModelLoadError
    from ..llama.model_runner import Tokenizer

    try:
        tokenizer = Tokenizer(model_path)
    except ModelLoadError as exc:
        results.send_bytes(encode(TokenizerLoadError(str(exc))))
        return
    results.send_bytes(encode(tokenizer.info()))
    batches = BatchTokenizer(tokenizer)
    while True:
        request: Union[TokenizeBatch, SpellChoices] = decode(requests.get())
        if isinstance(request, SpellChoices):
            results.send_bytes(encode(tokenizer.one_token(request.choices)))
        else:
            results.send_bytes(encode(batches.tokenize(request.texts, request.add_bos)))


def _name_process(name: bytes) -> None:
    """What ps and top show (15 bytes at most), so it is told apart from the workers."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name[:15])
    except (OSError, AttributeError):  # not Linux
        pass


class BatchTokenizer:
    """Batches tokenized in a fork; each crash of llama.cpp costs only the text it was on.
    `tokenizer` is model_runner.Tokenizer, or anything with its tokenize_into and gaps."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.fork = TokenizingFork(tokenizer)
        self.fatal: set[str] = set()  # characters llama.cpp has certainly aborted on

    def tokenize(self, texts: Sequence[str], add_bos: Sequence[bool]) -> TokenizedBatch:
        data, errors = _utf8(texts)
        self._reject_known(texts, data, errors, 0)
        tokens, counts = array("i"), array("i", [-1]) * len(texts)
        start, room = 0, 0
        while start < len(data):
            got = self.fork.run(data[start:], add_bos[start:], room)
            tokens.frombytes(got.tokens)
            counts[start:start + got.done] = array("i", got.counts)
            start += got.done
            if start < len(data) and got.died:
                errors[start] = self._why(texts[start], got)
                start += 1
                self._reject_known(texts, data, errors, start)
            room = got.needed  # text `start` did not fit: the next round has room for it
        return TokenizedBatch(tokens, counts, errors)

    def _reject_known(self, texts: Sequence[str], data: list[Optional[bytes]], errors: dict[int, str],
                      start: int) -> None:
        """Texts from `start` on holding a character llama.cpp has certainly aborted on: not sent."""
        if not self.fatal:
            return
        for i in range(start, len(texts)):
            text = texts[i]
            if data[i] is not None and not self.fatal.isdisjoint(text):
                data[i] = None
                errors[i] = _no_token(self.tokenizer.gaps().unknown(text))

    def _why(self, text: str, got: Round) -> str:
        """A dead fork's text, in words a user understands: the characters the vocabulary lacks
        when that is the reason, else how llama.cpp died and what it said."""
        gaps = self.tokenizer.gaps()
        chars = gaps.unknown(text) if gaps is not None else []
        if chars:
            self.fatal.update(gaps.certain(text))
            return _no_token(chars)
        if os.WIFSIGNALED(got.died):
            sig = os.WTERMSIG(got.died)
            how = "aborted" if sig == signal.SIGABRT else f"crashed ({signal.strsignal(sig) or sig})"
        else:
            how = f"failed (exit code {os.WEXITSTATUS(got.died)})"
        words = " ".join(got.last_words.decode("utf-8", "replace").split())[-300:]
        return f"llama.cpp's tokenizer {how} on this prompt" + (f": {words}" if words else "")

    def close(self) -> None:
        self.fork.close()


def _utf8(texts: Sequence[str]) -> tuple[list[Optional[bytes]], dict[int, str]]:
    """Texts as UTF-8; a string that has none (a lone surrogate from a JSON "\\ud800") is rejected."""
    data: list[Optional[bytes]] = []
    errors: dict[int, str] = {}
    for i, text in enumerate(texts):
        try:
            data.append(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            data.append(None)
            errors[i] = (f"not valid Unicode text: U+{ord(text[exc.start]):04X} at character {exc.start + 1} "
                         "is half of a surrogate pair")
    return data, errors


def _no_token(chars: Sequence[str]) -> str:
    return f"the model's vocabulary has no token for {_spell(chars)} (and no byte fallback)"


def _spell(chars: Sequence[str], most: int = 5) -> str:
    """'U+2019 ’, U+00E9 é and 3 more characters'."""
    named = [f"U+{ord(c):04X} {c}" if c.isprintable() and not c.isspace() else f"U+{ord(c):04X}"
             for c in chars[:most]]
    more = f" and {len(chars) - most} more characters" if len(chars) > most else ""
    return ", ".join(named) + more
