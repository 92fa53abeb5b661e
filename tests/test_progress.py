"""Progress that moves: live token rates and the time left from tokens (pure, no processes)."""

import contextlib
import io
import logging
import re
import time
from typing import Any, Iterator

from ggbatch.runner.watch.progress import Progress
from ggbatch.runner.watch.rates import RateWindow, eta_s, expected_length, generating, tokens_left
from ggbatch.workers.protocol import FinishReason
from helpers import answer as make_answer


def answer(qid, tokens):
    return make_answer(qid, finish=FinishReason.LENGTH, prompt_tokens=10, tokens=tokens, latency_s=1.0)


@contextlib.contextmanager
def logged(caplog: Any) -> Iterator[None]:
    """ggbatch's log records at INFO into caplog (its logger does not propagate to the root)."""
    logger = logging.getLogger("ggbatch")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="ggbatch"):
            yield
    finally:
        logger.removeHandler(caplog.handler)


class Clock:
    """A Progress clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def unclocked(record: logging.LogRecord) -> str:
    """A progress line less the wall clock it starts with (a log read later says when it slowed)."""
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (.*)$", record.getMessage(), re.DOTALL)
    assert stamp, record.getMessage()
    assert abs(time.mktime(time.strptime(stamp[1], "%Y-%m-%d %H:%M:%S")) - record.created) < 2
    return stamp[2]

def test_rates_are_over_the_last_window_only():
    w = RateWindow(window_s=5.0)
    assert w.rates(0.0) == (0.0, 0.0)
    w.add(0.0, 0, 0)
    w.add(1.0, 0, 1000)  # a prompt step
    assert w.rates(1.0) == (0.0, 1000.0)
    for t in range(2, 12):  # then 100 generated tokens a second
        w.add(float(t), 100 * (t - 1), 1000)
    assert w.rates(11.0) == (100.0, 0.0)  # the prompt step left the window


def test_slow_steps_show_their_rate_and_an_overdue_update_lets_it_fall():
    # A big model on a few cores: a step of 512 prompt tokens every 10 s.
    w = RateWindow(window_s=5.0)
    for i in range(4):
        w.add(10.0 * i, 0, 512 * i)
    assert w.rates(33.0) == (0.0, 51.2)  # between updates: the last interval's rate, not 0
    assert w.rates(40.0) == (0.0, 51.2)
    generated, prompt = w.rates(50.0)  # 20 s since the last update: overdue, falling
    assert generated == 0.0 and prompt == 512 / 30.0


def test_an_answer_is_expected_no_longer_than_a_sequences_context():
    """--max-tokens 100000000 on a 2,048-token model showed an ETA of hours for a 6 s run."""
    assert expected_length(100_000_000, [2048, 0]) == 2048
    assert expected_length(256, [2048, 4096]) == 256
    assert expected_length(8192, [2048, 4096]) == 4096  # the longest context a node's workers have
    assert expected_length(300, []) == expected_length(300, [0]) == 300  # no context known yet


def test_tokens_left_uses_max_tokens_before_any_answer_then_the_mean_answer():
    # 32 questions, none finished, 500 tokens generated: 32 × 256 - 500 left.
    assert tokens_left(32, 0, 0, 500, 256) == 32 * 256 - 500
    # 8 answers of 64 tokens in; 24 questions in flight hold 24 × 30 tokens already.
    assert tokens_left(32, 8, 8 * 64, 8 * 64 + 24 * 30, 256) == 32 * 64 - (8 * 64 + 24 * 30)
    assert tokens_left(32, 32, 2048, 2048, 256) == 0.0
    assert eta_s(1000.0, 100.0) == 10.0 and eta_s(1000.0, 0.0) is None and eta_s(0.0, 0.0) == 0.0


def test_generation_counts_as_started_once_the_questions_in_flight_have_a_token_each():
    assert not generating(5, 0, slots=32, left_q=32)  # the first prompts are still being decoded
    assert generating(32, 0, slots=32, left_q=32)
    assert generating(2, 0, slots=32, left_q=2)  # the tail: two questions left


def test_bar_moves_with_tokens_before_any_question_finishes():
    """The issue's wave: 32 questions on 32 slots, none finished for most of the run."""
    stream, clock = io.StringIO(), Clock()
    p = Progress(0, stream=stream, mode="bar", clock=clock)
    p.total, p.max_tokens, p.slots = 32, 64, 32
    for i in range(1, 6):
        p.tokens(generated=32 * 10 * i, prompt=32 * 80)
        clock.now += 0.05
    p.tick()
    p.close()
    last = stream.getvalue().split("\r")[-1]
    assert "0/32" in last
    assert "gen 0.0 tok/s" not in last and "gen " in last and "prompt " in last
    assert "<?" not in last  # the time left comes from tokens: 32 × 64 - 1600 at the live rate
    assert 0 < p.eta_s() < 10


def test_log_line_says_generated_and_prompt_rates_and_the_eta(caplog):
    clock = Clock()
    p = Progress(0, stream=io.StringIO(), mode="log", log_every_s=0.0, clock=clock)
    p.total, p.max_tokens, p.slots = 4, 100, 4
    p.tokens(0, 400)
    clock.now += 0.5
    p.tokens(40, 400)
    with logged(caplog):
        p.tick()
    line = unclocked(caplog.records[-1])
    assert line.startswith("0/4 done: 0 answered, 0 failed, 0.00 q/s, 80.0 generated tok/s, ")
    assert "prompt tok/s" in line and "ETA ? " not in line


def test_log_line_says_failed_questions_apart_from_answered(caplog):
    """Every question failing printed `3/4 answered (3 failed)`; the summary says 0 answered."""
    p = Progress(0, stream=io.StringIO(), mode="log", log_every_s=0.0)
    p.total, p.max_tokens, p.slots = 4, 100, 4
    p.answered([make_answer(q, error="cut") for q in "abc"] + [answer("d", 3)])
    with logged(caplog):
        p.tick()
    assert unclocked(caplog.records[-1]).startswith("4/4 done: 1 answered, 3 failed, ")


def test_without_token_counters_the_eta_comes_from_finished_questions():
    p = Progress(0, stream=io.StringIO(), mode="off")
    p.total, p.max_tokens, p.slots = 10, 100, 4
    assert p.eta_s() is None
    p.answered([answer("a", 3), answer("b", 3)])
    assert p.eta_s() > 0


def test_a_streamed_file_shows_its_estimated_total_until_its_last_window_is_in(caplog):
    from ggbatch.runner.files.shards import Shard
    from ggbatch.runner.job import streamed_total
    from ggbatch.runner.questions.prepare import Window

    first = Window([object()] * 8000, None, 8192, False)  # type: ignore[list-item]  # 192 repeat others' prompts
    assert streamed_total(first, 9000, None, 0, 0) == 8000 + round(808 * 8000 / 8192)
    assert streamed_total(first, 18000, Shard(0, 2), 0, 0) == 8000 + round(808 * 8000 / 8192)  # this shard's half
    assert streamed_total(first, 100, None, 0, 0) == 8000  # a poor guess never undercuts what is known
    # a resumed million-line file: the journal holds the first window and 5,760 more; 850,000 are left
    resumed = Window([object()] * 0, None, 8192, False)  # type: ignore[list-item]
    assert streamed_total(resumed, 1_000_000, None, 8192 + 5760, 8192) == 1_000_000 - 8192 - 5760
    assert streamed_total(first, 0, None, 0, 0) == 0  # not counted: no estimate
    p = Progress(0, stream=io.StringIO(), mode="log", log_every_s=0.0)
    p.total = 8000
    p.expect(8789)
    assert p.total == 8789
    with logged(caplog):
        p.tick()
        p.grow(700, last=True)  # the file held fewer than its lines said
        p.tick()
    said = [unclocked(r) for r in caplog.records]
    assert said[0].startswith("0/~8789 done") and said[-1].startswith("0/8700 done")
    assert p.total == 8700


def test_a_resumed_runs_line_says_its_total_is_what_is_left(caplog):
    """300 questions, 151 in the journal: the line said `0/149 answered`, as if 149 were all."""
    p = Progress(0, stream=io.StringIO(), mode="log", log_every_s=0.0)
    p.total, p.max_tokens, p.slots = 149, 100, 4
    p.resumed(151)
    with logged(caplog):
        p.tick()
    assert unclocked(caplog.records[-1]).startswith("0/149 left (151 in the journal) done: 0 answered, ")
