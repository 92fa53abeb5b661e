"""What a worker's death costs, and when deaths mean giving up. Pure bookkeeping: the pool
reports deaths and progress, this decides.

Deaths are budgeted by what the budget protects against, never as a number of restarts:
- a question that keeps killing workers, found by halving: the questions a dead worker held are
  split into two groups of suspects, each retried alone on a worker (nothing else with it); a
  group that survives is answered in one batch, a group that dies is halved again, so a question
  that kills every worker it is on is isolated in log2(questions held) deaths while its innocent
  batch-mates are answered in batches (retrying each of 128 suspects one by one would decode 128
  questions at one sequence a step). A question that has died alone `max_solo_deaths` times is
  failed with the reason; two, because a random kill (the OOM killer acting for another process,
  an operator) can hit a worker at any moment, but rarely twice on the same lone question;
- a crash loop: `max_barren_deaths` deaths in a row with no question answered or failed in between
  end the run (WorkerFailure, exit 1; the answers so far are kept);
- workers that cannot start at all: a worker that dies before it is ready three times running is
  given up; when no worker has ever been ready, dying at start-up is the job's problem, not a
  question's (a model llama.cpp aborts on, a memory limit): StartupError, exit 2.
Random kills between answers never end a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ...workers.limits import under_address_space_limit
from ...workers.llama.load_errors import says_memory
from ...workers.protocol import Answer, FinishReason, Question
from ..errors import GgbatchError, WorkerFailure

MAX_STARTUP_FAILURES = 3  # a worker dying this many times in a row before it is ready is given up
LAST_WORDS_BYTES = 4096


class StartupError(GgbatchError):
    """No worker could start: the model, the machine or a limit (exit 2)."""


@dataclass
class Death:
    worker_id: int
    how: str  # "signal 9", "exit code 1"
    words: str  # the worker's own error, or the last line it wrote to stderr
    before_ready: bool

    def __str__(self) -> str:
        return f"{self.how}: {self.words}" if self.words else self.how

    def limit(self) -> str:
        """The address-space limit's words (under_address_space_limit) where the death says memory ran
        out (std::bad_alloc, MemoryError): under ulimit -v it is the limit that ran out, while the machine
        may have memory to spare; '' for any other death, or without a limit."""
        return under_address_space_limit() if says_memory(self.words) else ""


@dataclass
class CrashBudget:
    n_workers: int
    max_solo_deaths: int = 2
    max_barren_deaths: int = 0  # 0: enough for every worker to kill a lone suspect, and once more
    barren_deaths: int = 0  # since the last answer or failure
    solo_deaths: dict[str, int] = field(default_factory=dict)  # question id -> deaths it was alone at
    startup_failures: dict[int, int] = field(default_factory=dict)  # worker id -> in a row
    auto_barren: bool = field(init=False, default=False)  # max_barren_deaths follows n_workers

    def __post_init__(self) -> None:
        self.auto_barren = not self.max_barren_deaths
        self.resize(self.n_workers)

    def resize(self, n_workers: int) -> None:
        """The run goes on with n_workers (the plan let some go): what is budgeted per worker counts
        those, or a budget sized for workers gone could never be spent before they all gave up."""
        self.n_workers = n_workers
        if self.auto_barren:
            self.max_barren_deaths = (self.max_solo_deaths + 1) * n_workers

    def progress(self) -> None:
        self.barren_deaths = 0

    def death(self, death: Death, lost: list[Question]) -> tuple[list[Answer], list[tuple[Question, ...]]]:
        """Account for a death and the questions the worker held: (answers failing the questions
        that reached their limit, groups of suspects to retry, each alone on a worker)."""
        self.barren_deaths += 1
        self.startup_failures[death.worker_id] = (self.startup_failures.get(death.worker_id, 0) + 1
                                                  if death.before_ready else 0)
        if len(lost) > 1:
            half = (len(lost) + 1) // 2
            return [], [tuple(lost[:half]), tuple(lost[half:])]
        if not lost:
            return [], []
        q = lost[0]
        n = self.solo_deaths[q.qid] = self.solo_deaths.get(q.qid, 0) + 1
        if n < self.max_solo_deaths:
            return [], [(q,)]
        return [Answer(qid=q.qid, text="", finish_reason=FinishReason.ERROR, prompt_tokens=len(q.tokens),
                       worker_id=death.worker_id,
                       error=f"a worker died {n} times while answering it alone (last: {death}){death.limit()}",
                       prompt_decoded=False)], []

    def give_up(self, death: Death, any_ready: bool, n_live: int) -> Optional[Exception]:
        """The error ending the run after this death, or None to go on."""
        if death.before_ready and not any_ready:
            under_limit = under_address_space_limit()
            if under_limit:
                return StartupError(f"worker {death.worker_id} could not start ({death}){under_limit}")
            if sum(self.startup_failures.values()) > self.n_workers:
                return StartupError(f"workers cannot start: worker {death.worker_id} died while starting "
                                    f"({death})")
        if n_live == 0 and not self.may_restart(death.worker_id):
            return WorkerFailure(f"no worker can start any more (last: worker {death.worker_id}, {death})"
                                 f"{death.limit()}")
        if self.barren_deaths > self.max_barren_deaths:
            limit = death.limit()  # ends in advice (': raise or remove the limit'): giving up comes after it
            return WorkerFailure(f"workers died {self.barren_deaths} times in a row with no question "
                                 f"answered in between (last: worker {death.worker_id}, {death}){limit}"
                                 f"{'; ' if limit else ': '}giving up")
        return None

    def may_restart(self, worker_id: int) -> bool:
        return self.startup_failures.get(worker_id, 0) < MAX_STARTUP_FAILURES


def last_words(log_path: Optional[str]) -> str:
    """The last line a worker wrote to its stderr (llama.cpp's GGML_ASSERT, a C++ terminate)."""
    if not log_path:
        return ""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - LAST_WORDS_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    if "GGML_ASSERT" in last:  # "/long/build/path/ggml.c:1644: GGML_ASSERT(...) failed"
        last = "llama.cpp: " + last[last.index("GGML_ASSERT"):]
    return last[:300]
