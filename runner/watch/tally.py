"""What the report says of the answers of a run, counted as they arrive: the answers themselves
go to the journal (runner/journal/journal.py) and are not kept, so a run of millions of questions holds
counts here, and a bounded sample of the answers' latencies and times to first token
(runner/watch/reservoir.py), not the answers.

    answers of this run ─▶ add    counts, tokens, latencies, per worker
    each record as the answers file is written ─▶ RecordCounts    the report's questions.* and errors

The work of this run is counted by prompt (identical prompts are answered once); what the run
came to is counted by record, the lines of the input a user counts (RecordCounts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from ...workers.protocol import Answer, FinishReason
from .reservoir import KEPT, Reservoir

FIRST_ERRORS = 20  # errors the report quotes


class AnswerTally:
    """The answers of this run as they arrive, one per prompt answered (RecordCounts counts the
    records, once the answers file is written)."""

    def __init__(self, kept: int = KEPT) -> None:
        """kept: latencies (and times to first token) kept for the percentiles."""
        self.made = 0  # by a worker in this run
        self.prompt_tokens = 0  # of the answers made whose prompt was decoded
        self.refused_tokens = 0  # of those made without decoding their prompt (too long, ...)
        self.generated_tokens = 0
        self.latency_s = Reservoir(kept)  # of the answers made without an error
        self.ttft_s = Reservoir(kept, seed=1)  # of those that generated a token
        self.by_worker: dict[int, list[int]] = {}  # worker id -> [answers, generated tokens]

    def add(self, answers: Iterable[Answer]) -> None:
        """Answers a worker made in this run."""
        for a in answers:
            self._made(a)

    def _made(self, a: Answer) -> None:
        self.made += 1
        if a.prompt_decoded:
            self.prompt_tokens += a.prompt_tokens
        else:  # no work of this run: a rate or a cache share counting them would be false
            self.refused_tokens += a.prompt_tokens
        self.generated_tokens += a.completion_tokens
        if a.error is None:
            self.latency_s.append(a.latency_s)
            if a.completion_tokens:
                self.ttft_s.append(a.ttft_s)
        mine = self.by_worker.setdefault(a.worker_id, [0, 0])
        mine[0] += 1
        mine[1] += a.completion_tokens

    def of_worker(self, worker_id: int) -> dict[str, Any]:
        questions, generated = self.by_worker.get(worker_id, (0, 0))
        return {"questions": questions, "generated_tokens": generated}


@dataclass
class RecordCounts:
    """The records of the input by what the answers file says of each: answered, failed (an
    error), not answered (the run ended first); how many took their answer from the journal,
    and each one's finish reason (each sample's, for a question with several). Every other count
    is of records, duplicates included, so they add up to the records of the input."""

    answered: int = 0
    failed: int = 0
    not_answered: int = 0
    from_journal: int = 0  # answered by an earlier run of this job (a failed answer is not reused)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    # failed because they were cut (max_tokens) before an answer held to choices or a grammar was
    # complete, and the first of them in input order: the log says them (runner/job.py)
    cut: int = 0
    first_cut: Optional[tuple[str, str]] = None  # (its id, its error: what ran out, and what to raise)
    # samples cut so, of questions their other samples answered (null in the answers' lists)
    cut_samples: int = 0
    first_cut_sample: Optional[tuple[str, str]] = None
    # (the record's id, its error) of the first FIRST_ERRORS failed records: a duplicate of a
    # failed prompt is named too, as `failed` counts it
    errors: list[tuple[str, str]] = field(default_factory=list)

    def count(self, qid: str, answer: Optional[Answer], from_journal: bool = False) -> None:
        """One record (its id) and its answer (None: it has none)."""
        if answer is None:
            self.not_answered += 1
            return
        # each sample of a question asking for several (n > 1) ended its own way
        self.finish_reasons.update(s.finish_reason.value for s in answer.samples or (answer,))
        self.from_journal += from_journal
        if answer.error is None:
            self.answered += 1
            cut = [s.error for s in answer.samples or () if s.error is not None]
            self.cut_samples += len(cut)
            if cut and self.first_cut_sample is None:
                self.first_cut_sample = (answer.qid, cut[0])
            return
        self.failed += 1
        if len(self.errors) < FIRST_ERRORS:
            self.errors.append((qid, answer.error))
        if was_cut(answer):
            self.cut += 1
            self.first_cut = self.first_cut or (answer.qid, answer.error)


def was_cut(answer: Answer) -> bool:
    """A failed answer that was cut before it was complete: the worker gives it the finish reason
    that ended it (`length`) rather than `error` (workers/engine/answers.py)."""
    return answer.error is not None and answer.finish_reason is not FinishReason.ERROR
