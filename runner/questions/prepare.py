"""From records to questions, a window of records at a time: render every prompt with the chat
template, tokenize it once, answer identical prompts once, reuse what the journal holds, order
the work, find the prefix every prompt shares.

    records ─▶ window of WINDOW records ─▶ QuestionMaker (runner/questions/maker.py): prompt, tokens,
    dedup, journal ─▶ order: longest first, or with the prefix cache groups of questions that
    share a prefix (runner/questions/prefix_groups.py) ─▶ the workers

A file of up to WINDOW records is one window: every question is known before the first is
dispatched, as the layout likes it. A bigger file streams: the layout is settled on the first
window (runner/job.py), its context grown if a later window needs more (runner/plan/growth.py), and
each next window is made while the workers answer the last, so the coordinator holds a window of
questions and a few bytes for each question before it (runner/files/compact.py), and the first answer
comes within seconds of the start.
"""

from __future__ import annotations

import logging
import threading
from array import array
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Sequence

from ...workers.engine.fits import length_problem
from ...workers.engine.memory_kind import MemoryKind
from ...workers.engine.sequence import common_prefix_len
from ...workers.protocol import GenerationParams, Question
from ..config.schema import CHOICES_AUTO, LOGLIKELIHOOD, JobConfig
from ..errors import ConfigError
from ..files.inputs import Record
from ..journal.journal import Journal
from ..plan.layout import PromptFacts, answer_tokens, context_limit, prompt_length
from ..words import counted
from .maker import QuestionMaker, QuestionSet
from .prefix_groups import Sharing, grouped_order
from .prompting import Prompting

log = logging.getLogger("ggbatch")

WINDOW = 8192  # records made into questions at a time


@dataclass(frozen=True)
class Window:
    questions: list[Question]  # to answer, in dispatch order
    sharing: Optional[Sharing]  # what the prefix cache's grouping found in it (None: off)
    records: int  # records it was made from
    last: bool  # no record follows


class Preparer:
    """A job's questions, a window of records at a time, made with `prompting`'s tokenizer and
    settings; answers `journal` holds are reused."""

    def __init__(self, config: JobConfig, prompting: Prompting, journal: Journal) -> None:
        self.config = config
        self.prompting = prompting
        self.maker = QuestionMaker(prompting.builder, [prompting.tokenizer], config, prompting.generation,
                                   prompting.info.n_vocab, prompting.unknown_token, journal)
        self.groups = 0  # groups numbered so far: each window's numbers follow the last's
        self.sharing = Sharing(0, 0, 0)  # summed over the windows
        self.note = SharingNote()  # the log's line on them, once the model's memory is known

    @property
    def generation(self) -> GenerationParams:
        return self.prompting.generation

    @property
    def made(self) -> QuestionSet:
        return self.maker.made

    def window(self, records: Sequence[Record], last: bool) -> Window:
        limit = context_limit(self.prompting.info.n_ctx_train, self.config.n_ctx)
        questions, sharing = order(self.maker.make(records), self.config.prefix_cache == "auto", limit)
        if sharing is not None and sharing.groups:
            questions = [replace(q, group=q.group + self.groups) if q.group else q for q in questions]
            self.groups += sharing.groups
            self.sharing = summed(self.sharing, sharing)
            self.note.add(sharing)
        return Window(questions, sharing, len(records), last)

    def windows(self, records: Iterator[Record], size: int = WINDOW) -> Iterator[Window]:
        """The windows of the records left, made one at a time as they are asked for."""
        batch: list[Record] = []
        for rec in records:
            batch.append(rec)
            if len(batch) == size:
                yield self.window(batch, False)
                batch = []
        yield self.window(batch, True)

    def say(self) -> None:
        """What the log says once about the questions that will not be answered as asked."""
        made = self.made
        refused = len(made.refused)
        if refused:
            log.warning("%d request%s cannot be answered as asked; the output says why on each (first: %s)",
                        refused, "s" if refused > 1 else "", made.first_refused)
        failed = {qid: a for qid, a in made.rejected.items() if qid not in made.refused}
        if failed:
            qid, answer = next(iter(failed.items()))
            log.warning("%d question%s cannot be tokenized by this model; the output says why on each "
                        "(first: %s: %s)", len(failed), "s" if len(failed) > 1 else "", qid, answer.error)


def facts(first: Window, preparer: Preparer, n_questions: int,
          longest_guess: int = 0) -> tuple[PromptFacts, array[int]]:
    """What the layout needs to know, from the first window (and, for a streamed file, a guess of
    the longest prompt to come), and the prefix every prompt of the first window shares."""
    prompts = [q.tokens for q in first.questions]
    prefix = common_prefix(prompts) if len(prompts) > 1 else array("i")
    longest = max(max(map(prompt_length, first.questions), default=0), longest_guess)
    # a question whose choices are scored as continuations shares its context among them: the
    # workers keep the prefix cache for it, as for a group of questions
    shared_contexts = sum(len(q.continuations) > 1 for q in first.questions) if first.sharing is not None else 0
    return PromptFacts(n_questions, longest, len(prefix), preparer.prompting.info.n_ctx_train,
                       preparer.prompting.dims, (first.sharing.groups if first.sharing else 0) + shared_contexts,
                       scored=preparer.config.choice_scoring == LOGLIKELIHOOD
                       or any(q.continuations for q in first.questions),
                       samples=max_samples(first.questions, preparer.generation)), prefix


def max_tokens(questions: Sequence[Question], generation: GenerationParams) -> int:
    """The most tokens any question may generate (runner/plan/layout.py answer_tokens): its own
    max_tokens, or the job's; none where every question only scores continuations."""
    return max((answer_tokens(q, generation) for q in questions), default=generation.max_tokens)


def most_said_by(questions: Sequence[Question], generation: GenerationParams, most: int) -> str:
    """Where the largest max_tokens (max_tokens()) was given: the job's key, or the first question
    whose own it is (an OpenAI Batch line's body.max_tokens), by its id."""
    if most == generation.max_tokens:
        return "max_tokens"
    own = next((q.qid for q in questions if q.generation is not None and answer_tokens(q, generation) == most), None)
    return "max_tokens" if own is None else f"question {own!r}: body.max_tokens (its own max_tokens)"


def question_samples(question: Question, generation: GenerationParams) -> int:
    """The samples a question draws: its own sampling.n (an OpenAI line's n), else the job's."""
    return (question.generation or generation).sampling.n


def max_samples(questions: Sequence[Question], generation: GenerationParams) -> int:
    """The most samples any question draws (sampling.n, an OpenAI line's n)."""
    return max((question_samples(q, generation) for q in questions), default=generation.sampling.n)


def check_sample_slots(slots: Sequence[int], samples: int, config: JobConfig) -> None:
    """ConfigError when a worker has fewer slots than the job's samples of a question: they decode
    together, each in a slot of its own, from one computation of the prompt. (A line asking for
    more than the slots, an OpenAI line's n, fails alone: workers/llama/engine.py.)"""
    fewest = min(slots, default=samples)
    if fewest >= samples:
        return
    why = (f"slots is {config.slots} (--slots)" if config.slots is not None
           else f"the memory plan leaves a worker {counted(fewest, 'slot')}")
    raise ConfigError(f"sampling.n: {samples} samples of a question decode together in {samples} slots, but {why}: "
                      "give more slots, or fewer samples")


def order(questions: list[Question], grouped: bool, limit: int = 0) -> tuple[list[Question], Optional[Sharing]]:
    """Longest prompts first, so that the long ones start early and the tail of the run stays
    short; `grouped`: the same by groups of questions sharing a prefix, kept together. A question
    too long for the largest context the job can have (`limit`, 0: none known) is in no group:
    every worker turns it away unread, so its prefix is no saving; such questions go last."""
    if not grouped:
        return sorted(questions, key=lambda q: len(q.tokens), reverse=True), None
    fitting: list[Question] = []
    too_long: list[Question] = []
    for q in questions:
        (too_long if limit and length_problem(q, limit) is not None else fitting).append(q)
    # the prefix of every prompt, as the workers are given it (runner/questions/prepare.py facts)
    n_prefix = len(common_prefix([q.tokens for q in questions])) if len(questions) > 1 else 0
    placed, sharing = grouped_order([q.tokens for q in fitting], n_prefix)
    return [replace(fitting[i], group=group) if group else fitting[i] for i, group in placed] + too_long, sharing


class SharingNote:
    """The log's line on what the prefix cache's groups save, said once the model's memory is known
    (the first worker's Ready): on a recurrent or hybrid memory the cache is off and saves nothing
    beyond the job's prefix, which the workers' note says instead (workers/engine/memory_kind.py),
    so the line is not said there. Groups found before that are said together, later ones as they
    are found (a streamed file's windows, made in the feed's thread: hence the lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memory: Optional[MemoryKind] = None
        self._unsaid = Sharing(0, 0, 0)

    def add(self, sharing: Optional[Sharing]) -> None:
        if sharing is None or not sharing.groups:
            return
        with self._lock:
            if self._memory is None:
                self._unsaid = summed(self._unsaid, sharing)
            else:
                say_sharing(sharing, self._memory)

    def memory_known(self, memory: str) -> None:
        """The model's memory, as a worker's engine found it (Ready.memory); the first one counts."""
        with self._lock:
            if self._memory is None:
                self._memory = MemoryKind(memory)
                say_sharing(self._unsaid, self._memory)


def summed(a: Sharing, b: Sharing) -> Sharing:
    return Sharing(a.groups + b.groups, a.grouped + b.grouped, a.shareable + b.shareable)


def say_sharing(sharing: Sharing, memory: MemoryKind) -> None:
    """The saving the groups bring, where the model's memory lets the prefix cache run."""
    if sharing.groups and memory.prefix_cache:
        one = sharing.groups == 1
        log.info("prefix cache: %d group%s of questions share%s a prefix (%d questions; %d prompt tokens "
                 "need not be computed again)", sharing.groups, "" if one else "s", "s" if one else "",
                 sharing.grouped, sharing.shareable)


def check_requests(config: JobConfig, first: Sequence[Record]) -> None:
    """Job settings an OpenAI Batch file's lines cannot take: a template over their fields, and
    each record's own choices (a line carries messages, not choices)."""
    if not first or first[0].request is None:
        return
    if config.prompt_template is not None:
        raise ConfigError(f"prompt.template: {config.input} holds OpenAI Batch requests, which bring their own "
                          "messages; remove prompt.template")
    if config.choices == CHOICES_AUTO:
        raise ConfigError(f"answer.choices: auto takes each record's own 'choices', and {config.input} holds OpenAI "
                          "Batch requests, whose lines carry none: list the choices (--choices A,B,C,D)")


def common_prefix(prompts: Sequence[array[int]]) -> array[int]:
    """The tokens every prompt starts with (system prompt, few-shot examples): decoded once per
    worker and shared by every sequence."""
    if not prompts:
        return array("i")
    n = len(prompts[0])
    for p in prompts[1:]:
        n = common_prefix_len(prompts[0][:n], p)
        if n == 0:
            break
    return prompts[0][:n]
