"""The one owner of the terminal: a tqdm bar on a TTY, a one-line log every few seconds otherwise
(cron). Log records go through tqdm.write so they never tear the bar."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, MutableMapping, Optional, Sequence, TextIO

from tqdm import tqdm

from ...workers.protocol import Answer
from .rates import RateWindow, eta_s, generating, tokens_left

log = logging.getLogger("ggbatch")


class TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stderr)


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """ggbatch's log on stderr; quiet keeps errors only (warnings go too: a script reads the exit
    code and the answers file), verbose adds worker start-up and errors in detail."""
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter("ggbatch: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG if verbose else logging.ERROR if quiet else logging.INFO)
    log.propagate = False
    if quiet:
        quiet_libraries()


# Libraries that write warnings of their own on stderr while ggbatch works: huggingface_hub says
# each try to reach the Hub ("Retrying in 8s [Retry 4/5].", a dozen lines without a network).
LIBRARY_LOGGERS = ("huggingface_hub",)


def quiet_libraries() -> None:
    """-q keeps their errors only, as ggbatch's own. huggingface_hub sets its logger's level when
    it is imported, from HF_HUB_VERBOSITY: that is where it is asked (unless the user set it), and
    the level is set now too, for where it is loaded already."""
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


class _Bar(tqdm):  # type: ignore[type-arg]  # tqdm[...] is the stubs' alone: not subscriptable at run time
    """tqdm whose time left is Progress's estimate from tokens when there is one (tqdm's own,
    from finished questions, says `?` until the first wave of answers)."""

    ends_at: Optional[float] = None  # time.monotonic() when the run should end

    @property
    def format_dict(self) -> MutableMapping[str, Any]:
        d = super().format_dict
        if self.ends_at is not None:
            d["left"] = self.format_interval(max(0.0, self.ends_at - time.monotonic()))
        elif d.get("rate") and d.get("total"):
            d["left"] = self.format_interval((d["total"] - d["n"]) / d["rate"])
        else:
            d["left"] = "?"
        return d


BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{left}, {rate_fmt}{postfix}]"


class Progress:
    def __init__(self, total: int, stream: Optional[TextIO] = None, log_every_s: float = 5.0,
                 mode: str = "auto", clock: Callable[[], float] = time.perf_counter) -> None:
        """mode: "bar", "log" (a line every log_every_s), "off", or "auto" (bar on a terminal).
        stream: sys.stderr as it is now (the command line's, safe from a closed pipe). clock: the
        seconds the rates and the time left are measured in (a test's own, which it moves)."""
        stream = stream if stream is not None else sys.stderr
        self._total = total
        self._estimate: Optional[int] = None  # a streamed file's questions in all, until its last window is in
        self.max_tokens = 0  # per answer: the expected length before any answer is in
        self.done = 0  # questions finished, answered or failed
        self.journaled = 0  # answers an earlier run of the job left in the journal: not in the total
        self.failed = 0
        self.done_tokens = 0  # generated tokens of the finished answers
        self.generated = 0  # generated tokens, finished answers or not (the engines' counters)
        self.prompt = 0  # prompt tokens decoded
        self.slots = 1  # decoded together over all workers
        self._rates = RateWindow()
        self._generating = False  # the in-flight questions have a token each (runner/watch/rates.py)
        self._clock = clock
        self._t0 = clock()
        self._log_every = log_every_s
        self._last_log = self._t0
        self._silent = mode == "off"
        use_bar = mode == "bar" or (mode == "auto" and stream.isatty())
        self._bar = _Bar(total=total or None, file=stream, unit="q", dynamic_ncols=True, smoothing=0.1,
                         bar_format=BAR_FORMAT) if use_bar else None

    @property
    def total(self) -> int:
        """The questions to answer: those known, or a streamed file's estimate while it is larger."""
        return max(self._total, self._estimate or 0)

    @total.setter
    def total(self, value: int) -> None:
        """Set once the questions left to answer are known (after tokenizing and the journal)."""
        self._total = value
        self._t0 = self._last_log = self._clock()
        self._rates = RateWindow()
        self._rates.add(self._t0, 0, 0)  # the engines' counters start with the run
        if self._bar is not None:
            self._bar.reset(total=value)

    def resumed(self, journaled: int) -> None:
        """The run resumes a job whose journal holds this many answers: the total is the
        questions left, and the bar and the line say so."""
        self.journaled = journaled
        if journaled and self._bar is not None:
            self._bar.set_description_str(f"{journaled} in the journal, left", refresh=False)

    def expect(self, estimate: int) -> None:
        """A streamed file holds about this many questions to answer in all (from its line count,
        runner/job.py streamed_total): the total shown until its last window is in."""
        self._estimate = estimate
        self._show_total()

    def grow(self, n: int, last: bool = False) -> None:
        """More questions to answer: the next window of a streamed file (`last`: no more follow,
        the total is known)."""
        self._total += n
        if last:
            self._estimate = None
        self._show_total()

    def _show_total(self) -> None:
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def answered(self, answers: Sequence[Answer]) -> None:
        self.done += len(answers)
        self.failed += sum(a.error is not None for a in answers)
        self.done_tokens += sum(a.completion_tokens for a in answers)
        if self._bar is not None:
            self._bar.update(len(answers))

    def tokens(self, generated: int, prompt: int) -> None:
        """The engines' counters summed (generated and prompt tokens so far in this run)."""
        self.generated, self.prompt = generated, prompt
        self._rates.add(self._clock(), generated, prompt)
        self._generating = self._generating or generating(generated, self.done_tokens, self.slots,
                                                          self.total - self.done)

    def eta_s(self) -> Optional[float]:
        """Seconds left: tokens left at the live generation rate once the engines generate in
        earnest (runner/watch/rates.py); before that, from finished questions if any; else None."""
        now = self._clock()
        if self._generating:
            left = tokens_left(self.total, self.done, self.done_tokens, self.generated, self.max_tokens)
            return eta_s(left, self._rates.rates(now)[0])
        q_rate = self.done / (now - self._t0) if now > self._t0 else 0.0
        return (self.total - self.done) / q_rate if q_rate > 0 else None

    def tick(self) -> None:
        gen_s, prompt_s = self._rates.rates(self._clock())
        if self.generated == 0 and self.done_tokens:  # an engine without counters: count the answers
            elapsed = self._clock() - self._t0
            gen_s = self.done_tokens / elapsed if elapsed > 0 else 0.0
        eta = self.eta_s()
        if self._bar is not None:
            self._bar.ends_at = time.monotonic() + eta if eta is not None else None
            self._bar.set_postfix_str(f"gen {gen_s:.1f} tok/s, prompt {prompt_s:.0f} tok/s"
                                      + (f", {self.failed} failed" if self.failed else ""))
        elif not self._silent and self._clock() - self._last_log >= self._log_every:
            self._last_log = self._clock()
            elapsed = self._last_log - self._t0
            rate = self.done / elapsed if elapsed > 0 else 0.0
            # answered and failed apart, as the summary says them: a failure is no answer; the clock
            # for a log read later (cron's mail, a Slurm job's file): when it slowed, when it stopped
            log.info("%s %d/%s%d %sdone: %d answered, %d failed, %.2f q/s, %.1f generated tok/s, %.1f prompt tok/s, "
                     "ETA %s", time.strftime("%Y-%m-%d %H:%M:%S"), self.done, "" if self._estimate is None else "~",
                     self.total,
                     f"left ({self.journaled} in the journal) " if self.journaled else "", self.done - self.failed,
                     self.failed, rate, gen_s, prompt_s, f"{eta:.0f} s" if eta is not None else "?")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
