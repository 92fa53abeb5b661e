"""From records to the questions the workers answer: each prompt rendered (runner/prompts.py)
and tokenized once (runner/tokenizing.py), with its own generation settings when its line asks
for any (runner/question_settings.py), identical ones answered once, and those that cannot be
answered turned into their error.

    record ─▶ prompt text ─▶ tokens ─▶ settings ─▶ Question | alias of an identical one | error answer

A record's prompt is the job's prompt.template through the chat template; an OpenAI Batch line's
is its messages through the chat template (/v1/chat/completions) or its prompt as it is
(/v1/completions).
"""

from __future__ import annotations

import zlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

from .answer_spec import format_grammar, record_choices, with_choices
from .config import CHOICES_AUTO, JobConfig
from .errors import ConfigError, quote
from .formats.record import Record
from .prompts import PLAIN_STOP, ChatTemplateError, PromptBuilder, TemplateFieldError
from .question_settings import QuestionSettings, is_greedy, own_generation, vocabulary_problem
from .tokenizing import Rejected, TokenizerProcess, tokenize_all
from ..workers.protocol import Answer, FinishReason, GenerationParams, Question


@dataclass
class QuestionSet:
    questions: list[Question] = field(default_factory=list)  # unique prompts (with their settings)
    aliases: dict[str, str] = field(default_factory=dict)  # qid -> qid of the identical question answered
    # qid -> its error answer, never sent to a worker nor journaled (a rerun tries again): a prompt
    # the model's tokenizer cannot take, a request refused as asked
    rejected: dict[str, Answer] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # of those, the requests refused as asked
    first_refused: str = ""  # "file:line: why", for the log
    completions: set[str] = field(default_factory=set)  # ids of raw /v1/completions prompts


def build_questions(records: list[Record], builder: PromptBuilder, tokenizers: list[TokenizerProcess],
                    config: JobConfig, job: GenerationParams, n_vocab: int) -> QuestionSet:
    """Render and tokenize every record; `job`: the job's generation settings."""
    maker = _Maker(builder, config, job, n_vocab)
    # The prompts are rendered as the tokenizer process takes them (rendering overlaps tokenizing);
    # the records of those rendered wait here, in order, for their tokens.
    waiting: deque[Record] = deque()

    def prompts() -> Iterator[tuple[str, bool]]:
        for rec in records:
            text = maker.prompt(rec)
            if text is not None:
                waiting.append(rec)
                yield text, builder.needs_bos(text)

    for tokens in tokenize_all(tokenizers, prompts()):
        maker.add(waiting.popleft(), tokens)
    return maker.made


class _Maker:
    def __init__(self, builder: PromptBuilder, config: JobConfig, job: GenerationParams, n_vocab: int) -> None:
        self.builder, self.config, self.job, self.n_vocab = builder, config, job, n_vocab
        self.made = QuestionSet()
        self._by_prompt: dict[object, str] = {}

    def prompt(self, rec: Record) -> Optional[str]:
        """The prompt text, or None for a request refused as asked (its error answer is made)."""
        req = rec.request
        if req is None:
            return self.builder.render(_user_message(self.builder, rec, self.config.input))
        why = req.error or vocabulary_problem(req.settings, self.n_vocab) or _format_problem(req.settings)
        if why is None and req.prompt is not None:
            self.made.completions.add(rec.qid)
            return req.prompt
        if why is None:
            try:
                return self.builder.render_messages(req.messages)
            except ChatTemplateError as exc:
                why = f"body.messages: {exc}"
        self._fail(rec.qid, why)
        self.made.refused.add(rec.qid)
        self.made.first_refused = self.made.first_refused or f"{self.config.input}:{rec.line}: {why}"
        return None

    def add(self, rec: Record, tokens: Union[array, Rejected]) -> None:
        if isinstance(tokens, Rejected):
            self._fail(rec.qid, tokens.reason)
            return
        own = self._own_generation(rec)
        # Identical prompts are answered once, but only when greedy and asked with equal settings:
        # with sampling each question has its own seed, so duplicates are meant to differ.
        key = tokens.tobytes() if own is None else (tokens.tobytes(), own)
        first = self._by_prompt.get(key)
        if first is not None and is_greedy(own or self.job):
            self.made.aliases[rec.qid] = first
            return
        self._by_prompt.setdefault(key, rec.qid)
        seed = rec.request.settings.seed if rec.request and rec.request.settings.seed is not None else None
        self.made.questions.append(Question(rec.qid, tokens, question_seed(self.config.sampling.seed, rec.qid)
                                            if seed is None else seed, own))

    def _own_generation(self, rec: Record) -> Optional[GenerationParams]:
        if rec.request is None:
            if self.config.choices != CHOICES_AUTO or self.job.answer is None:
                return None
            choices = record_choices(rec.fields, f"{self.config.input}:{rec.line}", rec.qid)
            return with_choices(self.job, choices)
        # A chat prompt on the plain template stops before inventing the next question; a raw
        # completion prompt has no template to stop at.
        template_stop = PLAIN_STOP if self.builder.is_plain and rec.request.prompt is None else ()
        fmt = rec.request.settings.response_format
        return own_generation(self.job, rec.request.settings, self.config.stop or template_stop,
                              format_grammar(fmt) if fmt is not None else None)

    def _fail(self, qid: str, why: str) -> None:
        self.made.rejected[qid] = Answer(qid, "", FinishReason.ERROR, 0, 0, -1, 0.0, 0.0, error=why)


def _format_problem(settings: QuestionSettings) -> Optional[str]:
    """Why a line's response_format cannot be enforced (its schema cannot become a grammar)."""
    if settings.response_format is None:
        return None
    try:
        format_grammar(settings.response_format)
    except ValueError as exc:
        return str(exc)
    return None


def _user_message(builder: PromptBuilder, rec: Record, path: str) -> str:
    try:
        return builder.user_message(rec.fields)
    except TemplateFieldError as exc:
        fields = ", ".join(map(str, rec.fields))
        raise ConfigError(f"{path}:{rec.line}: record '{rec.qid}' has no field '{exc.field}' "
                          f"that prompt.template uses (its fields: {quote(fields, 120)})") from None


def question_seed(job_seed: int, qid: str) -> int:
    """Per-question sampling seed: an answer never depends on which worker or slot produced it."""
    return zlib.crc32(f"{job_seed}:{qid}".encode("utf-8"))
