"""From records to questions: render every prompt with the chat template, tokenize it once,
answer identical prompts once, order the work, find the prefix every prompt shares.

    records ─▶ prompt (runner/questions.py) ─▶ tokens ─▶ dedup ─▶ shared prefix ─▶ order:
    longest first, or with the prefix cache groups of questions that share a prefix
    (runner/prefix_groups.py)
"""

from __future__ import annotations

import hashlib
import logging
import os
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

from .answer_spec import choice_tokens
from .config import JobConfig
from .errors import ConfigError
from .inputs import Record
from .layout import PromptFacts
from .memory import ModelDims, dims_from_metadata
from .prefix_groups import Sharing, grouped_order
from .prompts import PLAIN_STOP, PLAIN_TEMPLATE, PromptBuilder
from .question_settings import describe_own
from .questions import QuestionSet, build_questions
from .tokenizing import TokenizerProcess
from ..workers.protocol import Answer, AnswerSpec, GenerationParams, Question
from ..workers.sequence import common_prefix_len

log = logging.getLogger("ggbatch")


@dataclass(frozen=True)
class PreparedJob:
    ids: list[str]  # every record's id, in input order
    questions: list[Question]  # unique prompts, longest first
    aliases: dict[str, str]  # qid -> qid of the identical prompt that is actually answered
    prefix: array  # the tokens every prompt starts with
    generation: GenerationParams  # the job's; a question may have its own (Question.generation)
    chat_template: str  # "model", "plain" or "job"
    template_sha: str  # of the chat template text actually used
    dims: ModelDims
    n_ctx_train: int  # the model's training context (0 = unknown)
    # qid -> its error, for prompts the model's tokenizer cannot take and requests refused as
    # asked: never sent to a worker, never journaled (a rerun tries them again), merged into the
    # output with the answers
    rejected: dict[str, Answer] = field(default_factory=dict)
    refused: frozenset[str] = frozenset()  # of those, the requests refused as asked
    completions: frozenset[str] = frozenset()  # ids of raw /v1/completions prompts
    model_name: str = ""  # the GGUF's general.name, else its file name
    own_settings: dict[str, int] = field(default_factory=dict)  # for the report (describe_own)
    gpu_offload: bool = False  # the llama.cpp build can offload layers (the tokenizer process says)
    sharing: Optional[Sharing] = None  # what the prefix cache's grouping found (None: off)

    def facts(self, n_questions: int) -> PromptFacts:
        """What the layout needs to know, for n_questions left to answer."""
        longest = max((len(q.tokens) for q in self.questions), default=0)
        return PromptFacts(n_questions, longest, len(self.prefix), self.n_ctx_train, self.dims,
                           self.sharing.groups if self.sharing else 0)

    @property
    def max_tokens(self) -> int:
        """The most tokens any question may generate: its own max_tokens, or the job's."""
        return max((q.generation.max_tokens if q.generation else self.generation.max_tokens
                    for q in self.questions), default=self.generation.max_tokens)


def prepare(config: JobConfig, model_path: str, records: list[Record],
            answer: Optional[AnswerSpec] = None) -> PreparedJob:
    """Render and tokenize every question, with llama.cpp's tokenizer in a process of its own
    (runner/tokenizing.py), where a crash on text the vocabulary cannot take costs one question.
    `answer`: what every answer must be (runner/answer_spec.py job_answer), checked already."""
    if config.prompt_template is not None and records and records[0].request is not None:
        raise ConfigError(f"prompt.template: {config.input} holds OpenAI Batch requests, which bring their own "
                          "messages; remove prompt.template")
    with TokenizerProcess(model_path) as tokenizer:
        info = tokenizer.info
        template, kind = chat_template(config, info.chat_template)
        builder = PromptBuilder(template, config.system, config.prompt_template, config.question_field,
                                info.bos_text, info.eos_text, config.template_kwargs)
        stop = config.stop or (PLAIN_STOP if builder.is_plain else ())
        max_tokens = choice_tokens(config.max_tokens, answer.choices) if answer is not None else config.max_tokens
        generation = GenerationParams(max_tokens, stop, config.ignore_eos, config.sampling, answer=answer)
        made = build_questions(records, builder, [tokenizer], config, generation, info.n_vocab)
    _say(made)
    dims = dims_from_metadata(info.metadata.get, os.path.getsize(model_path), info.n_vocab)
    questions, sharing = order(made.questions, config.prefix_cache == "auto")
    prefix = common_prefix([q.tokens for q in questions]) if len(questions) > 1 else array("i")
    template_sha = hashlib.sha256((template or PLAIN_TEMPLATE).encode()).hexdigest()[:16]
    own = describe_own([q.generation for q in questions if q.generation is not None])
    # Only the ids are kept: the records' fields were needed for rendering alone.
    return PreparedJob([r.qid for r in records], questions, made.aliases, prefix, generation, kind, template_sha,
                       dims, info.n_ctx_train, made.rejected, frozenset(made.refused), frozenset(made.completions),
                       info.metadata.get("general.name") or Path(model_path).stem, own, info.gpu_offload,
                       sharing)


def order(questions: list[Question], grouped: bool) -> tuple[list[Question], Optional[Sharing]]:
    """Longest prompts first, so that the long ones start early and the tail of the run stays
    short; `grouped`: the same by groups of questions sharing a prefix, kept together."""
    if not grouped:
        return sorted(questions, key=lambda q: len(q.tokens), reverse=True), None
    prompts = [q.tokens for q in questions]
    n_prefix = len(common_prefix(prompts)) if len(prompts) > 1 else 0
    placed, sharing = grouped_order(prompts, n_prefix)
    if sharing.groups:
        log.info("prefix cache: %d groups of questions share a prefix (%d questions; %d prompt tokens "
                 "need not be computed again)", sharing.groups, sharing.grouped, sharing.shareable)
    return [replace(questions[i], group=group) if group else questions[i] for i, group in placed], sharing


def _say(made: QuestionSet) -> None:
    """What the log says once about the questions that will not be answered as asked."""
    refused = len(made.refused)
    if refused:
        log.warning("%d request%s cannot be answered as asked; the output says why on each (first: %s)",
                    refused, "s" if refused > 1 else "", made.first_refused)
    failed = {qid: a for qid, a in made.rejected.items() if qid not in made.refused}
    if failed:
        qid, answer = next(iter(failed.items()))
        log.warning("%d question%s cannot be tokenized by this model; the output says why on each "
                    "(first: %s: %s)", len(failed), "s" if len(failed) > 1 else "", qid, answer.error)


def chat_template(config: JobConfig, model_template: Optional[str]) -> tuple[Optional[str], str]:
    """(template text or None for the plain one, which: "model", "plain" or "job")."""
    if config.chat_template == "auto":
        return (model_template, "model") if model_template else (None, "plain")
    if config.chat_template == "plain":
        return None, "plain"
    return config.chat_template, "job"


def common_prefix(prompts: Sequence[array]) -> array:
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
