"""From records to the questions the workers answer: each prompt rendered (runner/questions/prompts.py)
and tokenized once (runner/questions/tokenizing.py), with its own generation settings when its line asks
for any (runner/files/formats/own_settings.py), identical ones answered once, and those that cannot be
answered turned into their error.

    record ─▶ answer in the journal (by the record's hash)
           ─▶ prompt text ─▶ tokens ─▶ settings ─▶ Question | alias of an identical one
                                                   | answer in the journal (by the prompt's hash) | error answer

A record's prompt is the job's prompt.template through the chat template; an OpenAI Batch line's
is its messages through the chat template (/v1/chat/completions) or its prompt as it is
(/v1/completions).
"""

from __future__ import annotations

import logging
import zlib
from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Protocol, Sequence, Union

from ...workers.protocol import Answer, FinishReason, GenerationParams, Question
from ..config.answer import format_grammar, record_choices, room_for_choices, scored_texts, with_choices
from ..config.reasoning import answer_room_problem, effort_problem, scoring_context, with_effort
from ..config.schema import CHOICES_AUTO, LOGLIKELIHOOD, JobConfig
from ..errors import ConfigError, quote
from ..files.compact import HashIndex, IdColumn, IdSet, key64, text_key
from ..files.formats.openai_request import COMPLETION, RESPONSES, Request
from ..files.formats.own_settings import (
    PLAIN_TEXT,
    QuestionSettings,
    describe_own,
    is_greedy,
    own_generation,
    samples_problem,
    settings_key,
    vocabulary_problem,
)
from ..files.formats.record import Record
from ..journal.index import prompt_key
from ..journal.journal import Expected, prompt_hash, record_hash
from .continuations import pair_texts_of, scored_tokens, split_tokens, unspellable
from .prompting import template_opens_block
from .prompts import PLAIN_STOP, ChatTemplateError, PromptBuilder, TemplateFieldError
from .tokenizing import Rejected, TokenizerProcess, tokenize_all

log = logging.getLogger("ggbatch")

CHECK_MASK = (1 << 31) - 1
INDEX_MASK = (1 << 32) - 1


class Reuse(Protocol):
    """What the maker asks of a job's journal (runner/journal/journal.py Journal): answers held
    from an earlier run, and which questions are expected now. A warm pool holds none
    (runner/warm/calls.py NO_REUSE)."""

    def reuse_records(self, keys: Sequence[int], records: Sequence[int]) -> list[Optional[int]]: ...

    def reuse_prompt(self, qid: str, prompt: str) -> bool: ...

    def expect(self, qid: str, expected: Expected) -> None: ...


@dataclass
class QuestionSet:
    """What the questions of a job came to, window after window (the questions themselves go to
    the workers and are not kept)."""

    # Ids among the job's (runner/files/compact.py: compact, as every line of a big OpenAI Batch file may be one)
    refused: IdSet  # requests refused as asked (each also in `rejected`)
    completions: IdSet  # /v1/completions lines (answered with text_completion bodies)
    responses: IdSet  # /v1/responses lines (answered with response bodies)
    from_journal: IdSet  # questions whose answer the journal held (an identical prompt's records take it too)
    # qid -> its error answer, never sent to a worker nor journaled (a rerun tries again): a prompt
    # the model's tokenizer cannot take, a request refused as asked
    rejected: dict[str, Answer] = field(default_factory=dict)
    first_refused: str = ""  # "file:line: why", for the log
    own_settings: Counter[str] = field(default_factory=Counter)  # question_settings.describe_own, summed
    # Distinct prompts, answered now or before (from the journal) or failing to tokenize: identical
    # ones count once when they are answered once (greedy, equal settings)
    unique: int = 0


class QuestionMaker:
    """Records to the questions the workers answer, a window of records at a time; what must be
    remembered across windows (which prompts were seen, the journal) is kept compact."""

    def __init__(self, builder: PromptBuilder, tokenizers: list[TokenizerProcess], config: JobConfig,
                 job: GenerationParams, n_vocab: int, unknown_token: Optional[int], journal: Reuse,
                 where: Optional[Callable[[Record], str]] = None) -> None:
        """`unknown_token`: the vocabulary's (Prompting.unknown_token), which no record's own choice
        may be read as; `where`: how an error names a record (default: its file and line; a pool's
        call: the caller's questions[i])."""
        self.builder, self.tokenizers, self.config, self.job, self.n_vocab = builder, tokenizers, config, job, n_vocab
        self.unknown_token = unknown_token
        self.journal = journal
        self.where = where or (lambda rec: f"{config.input}:{rec.line}")
        # Identical prompts: the prompt hash's first 64 bits -> (31 more bits << 32) | index in
        # self.ids of the first one; 95 bits must match for a question to take another's answer.
        self._first = HashIndex()
        self.ids = IdColumn()
        self.made = QuestionSet(refused=IdSet(self.ids), completions=IdSet(self.ids), responses=IdSet(self.ids),
                                from_journal=IdSet(self.ids))
        self._failed_prompts: set[int] = set()  # key64 of the prompts the tokenizer refused (and settings)
        self._opens_block: Optional[bool] = None  # whether the chat template opens the thinking block
        self._said_texts = False  # _say_texts_scored, once a run

    def make(self, records: Sequence[Record]) -> list[Question]:
        """The questions of these records still to answer, in file order; the rest are answers
        the journal holds, aliases of identical prompts, or errors (self.made)."""
        questions: list[Question] = []
        # rendered, waiting for their tokens (and their choices, scored as continuations)
        waiting: deque[tuple[Record, int, str, Optional[GenerationParams], tuple[str, ...], tuple[str, ...]]] = deque()
        first, journaled = self._take_in(records)

        def prompts() -> Iterator[tuple[str, bool]]:
            for index, (rec, prompt) in enumerate(zip(records, journaled), start=first):
                if prompt is not None:
                    continue
                text = self.prompt(rec, index)
                if text is None:
                    continue
                own = self._own_generation(rec, text)
                choices, spelt = self._tokenized_choices(rec, own)
                if choices:  # a line's own settings change the budget only, not the block
                    self._say_texts_scored(rec, own)
                    text = scoring_context(text, self.job.thinking)
                waiting.append((rec, index, text, own, choices, spelt))
                bos = self.builder.needs_bos(text)
                for piece in pair_texts_of(text, choices):
                    yield piece, bos
                for choice in spelt:
                    yield choice, False

        # The prompts are rendered as the tokenizer process takes them (rendering overlaps tokenizing).
        tokenized = tokenize_all(self.tokenizers, prompts())
        for tokens in tokenized:
            rec, index, text, own, choices, spelt = waiting.popleft()
            tokens, continuations = split_tokens(tokens, [next(tokenized) for _ in choices])
            tokens = unspellable(spelt, [next(tokenized) for _ in spelt], self.unknown_token) or tokens
            if isinstance(tokens, Rejected):
                self._count_failed(rec, text, own)
            question = self.add(rec, index, tokens, own, continuations)
            if question is not None:
                questions.append(question)
        return questions

    def _tokenized_choices(self, rec: Record, own: Optional[GenerationParams]
                           ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the texts scored as continuations of this record's prompt (answer.choice_scoring:
        loglikelihood), the record's own choices (answer.choices: auto) its answer is generated
        among), `own` its own generation. The second go through the tokenizer alone, as the job's
        own list does before the run (check_spellable), so that one the vocabulary cannot write
        fails the record by name, not by never winning. Scored as continuations, the record's own
        are spelt alone too: a continuation read as the unknown token would be scored as that token."""
        answer = (own or self.job).answer
        if answer is None:
            return (), ()
        records_own = own is not None and rec.request is None and self.config.choices == CHOICES_AUTO
        if self.config.choice_scoring == LOGLIKELIHOOD:
            scored = answer.texts or answer.choices
            return scored, scored if records_own else ()
        return (), answer.choices if records_own else ()

    def _say_texts_scored(self, rec: Record, own: Optional[GenerationParams]) -> None:
        """Say, once a run, that labelled choices are scored by their texts and answered by their
        labels: lm-eval's MMLU lists its choices in the question and scores the letters, its ARC
        and OpenBookQA do not and score the texts (runner/config/answer.py scored_texts)."""
        if self._said_texts or own is None or own.answer is None or not own.answer.texts:
            return
        self._said_texts = True
        log.info("%s: record '%s': its prompt does not list its choices beside their labels, so their texts are "
                 "scored and their labels answered (as lm-eval's ARC; said once)", self.where(rec), rec.qid)

    def take_unmade(self, records: Sequence[Record]) -> None:
        """Records a stopped run never made into questions (runner/questions/feed.py read_rest):
        each gets its row in the answers file, and one whose answer the journal holds keeps it,
        as in a window made; the others say why they have none."""
        self._take_in(records)

    def _take_in(self, records: Sequence[Record]) -> tuple[int, list[Optional[int]]]:
        """The records' ids join the job's, and those whose answer the journal holds for the
        record as written take it: (the first one's index in self.ids, each one's prompt key when
        held, else None)."""
        journaled = self.journal.reuse_records([rec.key or text_key(rec.qid) for rec in records],
                                               [rec.digest for rec in records])
        first = len(self.ids)
        self.ids.extend(rec.qid for rec in records)
        self._kinds(records, first)
        self._journaled([(first + i, rec, prompt) for i, (rec, prompt) in enumerate(zip(records, journaled))
                         if prompt is not None])
        return first, journaled

    def _kinds(self, records: Sequence[Record], first: int) -> None:
        """Which lines are /v1/completions or /v1/responses requests, from the lines themselves:
        an answer the journal holds is written as the kind of body its line asks for, like a new one."""
        kinds = {COMPLETION: self.made.completions, RESPONSES: self.made.responses}
        for index, rec in enumerate(records, start=first):
            if rec.request is not None and rec.request.endpoint in kinds:
                kinds[rec.request.endpoint].add(rec.qid, index)

    def _journaled(self, held: list[tuple[int, Record, int]]) -> None:
        """Records whose answer the journal holds (index in self.ids, record, its prompt's key):
        reused without rendering or tokenizing; a resumed file's first half comes here."""
        owns = [self._own_generation(rec) for _, rec, _ in held]
        greedy = [(prompt, index) for (index, _, prompt), own in zip(held, owns) if is_greedy(own or self.job)]
        # A journaled prompt is found by its 64 bits, without the 31 more (_first_of).
        self._first.add_many([prompt for prompt, _ in greedy], [index for _, index in greedy])
        for (index, rec, _), own in zip(held, owns):
            self.made.from_journal.add(rec.qid, index)
            if own is not None:
                self._count_own(own)
        self.made.unique += len(held)

    def prompt(self, rec: Record, index: int) -> Optional[str]:
        """The prompt text, or None for a request refused as asked (its error answer is made)."""
        req = rec.request
        if req is None:
            turns = self.builder.conversation(rec.fields)
            if turns is None:
                return self.builder.render(_user_message(self.builder, rec, self.where(rec)))
            text, refused = self._rendered(turns)  # a conversation that cannot be rendered fails alone
            if refused is not None:
                self._fail(rec.qid, f"{self.builder.question_field}: {refused}")
            return text
        why = (req.error or vocabulary_problem(req.settings, self.n_vocab) or _format_problem(req.settings)
               or samples_problem(req.settings, self.job) or self._one_answer_problem(req)
               or self._thinking_problem(rec))
        if why is None and req.prompt is not None:
            return req.prompt
        if why is None:
            text, refused = self._rendered(req.messages)
            if refused is None:
                return text
            why = f"{req.field('messages')}: {refused}"
        self._fail(rec.qid, why)
        self.made.refused.add(rec.qid, index)
        self.made.first_refused = self.made.first_refused or f"{self.where(rec)}: {why}"
        return None

    def _rendered(self, turns: Sequence[tuple[str, str]]) -> tuple[Optional[str], Optional[str]]:
        """(the prompt of a conversation through the chat template, None) for a chat line's
        messages and a record's conversation alike; (None, why) where its system message would be
        dropped or the template refuses it."""
        why = self.builder.system_problem(turns)
        if why is not None:
            return None, why
        try:
            return self.builder.render_messages(turns), None
        except ChatTemplateError as exc:
            return None, str(exc)

    def _one_answer_problem(self, req: Request) -> Optional[str]:
        """Why a /v1/responses line cannot take the job's n samples: the Responses API has no n,
        and its response holds one answer."""
        n = self.job.sampling.n
        if req.endpoint != RESPONSES or n == 1:
            return None
        return f"sampling.n (--n {n}) of the job: a /v1/responses line has one answer (the Responses API has no n)"

    def _thinking_problem(self, rec: Record) -> Optional[str]:
        """Why a line's reasoning_effort cannot apply (runner/config/reasoning.py effort_problem),
        or its answer has no room after its thinking; a line whose choices are scored by
        log-likelihood generates nothing, so it needs no room (a line held to its own
        response_format in such a job is generated, and does)."""
        assert rec.request is not None
        scored = bool(self._tokenized_choices(rec, self._own_generation(rec))[0])
        return (effort_problem(rec.request.settings.reasoning_effort, self.job, scored,
                               rec.request.field("reasoning_effort"))
                or (None if scored else self._room_problem(rec)))

    def _room_problem(self, rec: Record) -> Optional[str]:
        """Why a line's answer, held to choices or its response_format, has no room after the
        thinking under its own max_tokens and budget (the job's are checked when the job starts)."""
        if self.job.thinking is None or rec.request is None:
            return None  # a model that does not think: every line has its max_tokens for its answer
        own = self._own_generation(rec)
        if own is None or own.answer is None:
            return None
        settings = rec.request.settings
        tokens = rec.request.field("max_tokens") if settings.max_tokens else "max_tokens"
        effort = settings.reasoning_effort
        budget = (f"the thinking budget of {rec.request.field('reasoning_effort')} {effort!r}" if effort
                  else "reasoning.max_tokens")
        if self._opens_block is None:  # the job's template, as the first line that asks shows: once
            self._opens_block = template_opens_block(self.builder, self.job.thinking)
        return answer_room_problem(own.thinking, own.max_tokens, (tokens, budget), self._opens_block)

    def add(self, rec: Record, index: int, tokens: Union[array[int], Rejected], own: Optional[GenerationParams],
            continuations: tuple[array[int], ...] = ()) -> Optional[Question]:
        """The question to answer, or None: it failed, takes an identical prompt's answer, or the
        journal holds its answer. `own`: its own generation (_own_generation)."""
        if isinstance(tokens, Rejected):
            self._fail(rec.qid, tokens.reason)
            return None
        h = prompt_hash(scored_tokens(tokens, continuations), own)
        # Identical prompts are answered once, but only when greedy and asked with equal settings
        # (in the hash): with sampling each question has its own seed, so duplicates are meant to differ.
        if is_greedy(own or self.job):
            first = self._first_of(h)
            if first is not None:
                self.ids.same_as(index, first)
                return None
            self._first.add(prompt_key(h), (int(h[16:24], 16) & CHECK_MASK) << 32 | index)
        reused = self.journal.reuse_prompt(rec.qid, h)
        self._count(own)
        if reused:
            self.made.from_journal.add(rec.qid, index)
            return None
        self.journal.expect(rec.qid, Expected(h, record_hash(rec.digest) if rec.digest else ""))
        seed = rec.request.settings.seed if rec.request and rec.request.settings.seed is not None else None
        return Question(rec.qid, tokens, question_seed(self.config.sampling.seed, rec.qid) if seed is None else seed,
                        own, continuations=continuations)

    def _first_of(self, h: str) -> Optional[int]:
        """The index of the first question with this prompt hash, if one was seen."""
        value = self._first.get(prompt_key(h))
        if value is None:
            return None
        check, index = value >> 32, value & INDEX_MASK
        return index if check in (0, int(h[16:24], 16) & CHECK_MASK) else None

    def _count(self, own: Optional[GenerationParams]) -> None:
        self.made.unique += 1
        if own is not None:
            self._count_own(own)

    def _count_failed(self, rec: Record, text: str, own: Optional[GenerationParams]) -> None:
        """A prompt the tokenizer refused is one of the unique prompts once, as an identical
        prompt it could take would be answered once (greedy, equal settings)."""
        if is_greedy(own or self.job):
            key = key64(text.encode("utf-8", "surrogatepass") + (settings_key(own) if own is not None else b""))
            if key in self._failed_prompts:
                return
            self._failed_prompts.add(key)
        self.made.unique += 1

    def _count_own(self, own: GenerationParams) -> None:
        self.made.own_settings.update(describe_own([own]))

    def _own_generation(self, rec: Record, prompt: Optional[str] = None) -> Optional[GenerationParams]:
        """A record's settings where they are not the job's: a line's own, or a record's own
        choices; given its rendered prompt, those choices scored as what it shows of them
        (scored_texts; a record's journaled answer, reused without rendering, needs none)."""
        if rec.request is None:
            if self.config.choices != CHOICES_AUTO or self.job.answer is None:
                return None
            read = record_choices(rec.fields, self.where(rec), rec.qid)
            scoring = self.config.choice_scoring == LOGLIKELIHOOD
            return with_choices(self.job, read.answered, scored_texts(read, prompt) if scoring and prompt else ())
        # A chat prompt on the plain template stops before inventing the next question; a raw
        # completion prompt has no template to stop at.
        template_stop = PLAIN_STOP if self.builder.is_plain and rec.request.prompt is None else ()
        fmt = rec.request.settings.response_format
        settings = rec.request.settings
        own = own_generation(self.job, settings, self.config.stop or template_stop,
                             format_grammar(fmt) if fmt not in (None, PLAIN_TEXT) else None)
        gen = with_effort(own, self.job, settings.reasoning_effort)
        if gen is not None and settings.reasoning_effort and not settings.max_tokens:
            # the job's max_tokens was cut to its own budget's room and its choices: another budget, another room
            gen = room_for_choices(gen, self.config.max_tokens)
        return gen

    def _fail(self, qid: str, why: str) -> None:
        self.made.rejected[qid] = Answer(qid=qid, text="", finish_reason=FinishReason.ERROR, error=why)


def _format_problem(settings: QuestionSettings) -> Optional[str]:
    """Why a line's response_format cannot be enforced (its schema cannot become a grammar)."""
    if settings.response_format in (None, PLAIN_TEXT):
        return None
    try:
        format_grammar(settings.response_format)
    except ValueError as exc:
        return str(exc)
    return None


def _user_message(builder: PromptBuilder, rec: Record, where: str) -> str:
    try:
        return builder.user_message(rec.fields)
    except TemplateFieldError as exc:
        fields = ", ".join(map(str, rec.fields))
        raise ConfigError(f"{where}: record '{rec.qid}' has no field '{exc.field}' "
                          f"that prompt.template uses (its fields: {quote(fields, 120)})") from None
    except ConfigError as exc:  # the template failed on this record's fields
        raise ConfigError(f"{where}: record '{rec.qid}': {exc}") from None


def question_seed(job_seed: int, qid: str) -> int:
    """Per-question sampling seed: an answer never depends on which worker or slot produced it."""
    return zlib.crc32(f"{job_seed}:{qid}".encode("utf-8"))
