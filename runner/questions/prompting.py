"""What every prompt of a job or a pool is made with: the tokenizer process (the model's
vocabulary), the prompt builder (chat template, system prompt, prompt.template) and the
generation settings every answer is asked with. Built once the model's vocabulary is loaded;
a journal's fingerprint (runner/journal/journal.py) and the layout's memory plan read it.

A pool's call may change the system prompt, the sampling, max_tokens or what the answer must be
(runner/warm/overrides.py): `builder_for` and `generation_for` make the call's own from the
same pieces, so a call is made exactly as a job with those settings would be.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Optional

from ...workers.helper_messages import VocabInfo
from ...workers.protocol import AnswerSpec, GenerationParams, Thinking
from ..config.answer import (
    UNKNOWN_TOKEN_KEY,
    check_logprob_choices,
    check_schema_opener,
    check_spellable,
    choice_tokens,
    unknown_token_id,
)
from ..config.reasoning import (
    answer_room_problem,
    block_opened,
    model_thinking,
    scoring_problem,
    thinking_room,
    with_budget,
)
from ..config.schema import LOGLIKELIHOOD, JobConfig
from ..errors import ConfigError
from ..model.gguf_header import GGUFFormatError, HParam, read_hparams
from ..model.hub import model_bytes
from ..plan.memory import ModelDims, dims_from_metadata
from ..plan.repack import cpu_flags
from ..plan.repack_share import repacked_bytes
from .prompts import PLAIN_STOP, PLAIN_TEMPLATE, PromptBuilder
from .tokenizing import TokenizerProcess

log = logging.getLogger("ggbatch")


class Prompting:
    """The tokenizer process and what a job's prompts have in common. `answer`: what every answer
    must be (runner/config/answer.py job_answer), checked already."""

    def __init__(self, config: JobConfig, model_path: str, answer: Optional[AnswerSpec] = None) -> None:
        self.tokenizer = TokenizerProcess(model_path)
        try:
            info = self.tokenizer.info
            self.info: VocabInfo = info
            self.unknown_token = unknown_token_id(info.metadata.get(UNKNOWN_TOKEN_KEY))
            template, self.chat_template = chat_template(config, info.chat_template)
            self.template = template
            self.builder = self.builder_for(config)
            self.thinking: Optional[Thinking] = model_thinking(self.tokenizer)
            self._said_nothing_to_keep = False
            self.generation = self.generation_for(config, answer)
            self.template_sha = hashlib.sha256((template or PLAIN_TEMPLATE).encode()).hexdigest()[:16]
            self.dims: ModelDims = dims_from_metadata(info.metadata.get, model_bytes(model_path), info.n_vocab,
                                                      _hparams(model_path), repacked_bytes(model_path, cpu_flags()))
            self.model_name = info.metadata.get("general.name") or Path(model_path).stem
        except BaseException:
            self.tokenizer.close()  # a job refused here leaves no process behind
            raise

    def builder_for(self, config: JobConfig) -> PromptBuilder:
        """The prompt builder of these settings (system prompt, prompt.template, template kwargs)."""
        info = self.info
        return PromptBuilder(self.template, config.system, config.prompt_template, config.question_field,
                             info.bos_text, info.eos_text, config.template_kwargs,
                             "prompt.chat_template" if self.chat_template == "job" else "chat template")

    def generation_for(self, config: JobConfig, answer: Optional[AnswerSpec]) -> GenerationParams:
        """Every answer's settings under this config; fixed choices are checked against the
        vocabulary (ConfigError naming the first it cannot spell)."""
        unknown = self.unknown_token
        if answer is not None and config.json_schema is not None:
            check_schema_opener(self.tokenizer, config.json_schema, unknown)
        if answer is not None and answer.choices:
            check_spellable(self.tokenizer, answer.choices, unknown)
            if answer.logprobs and config.choice_scoring != LOGLIKELIHOOD:
                check_logprob_choices(self.tokenizer, answer.choices)
        stop = config.stop or (PLAIN_STOP if self.template is None else ())
        try:
            thinking = with_budget(self.thinking, config.thinking_budget, "reasoning.max_tokens")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        max_tokens = config.max_tokens
        generated = answer is not None and config.choice_scoring != LOGLIKELIHOOD  # a scored choice is not
        opened = thinking is None or template_opens_block(self.builder, thinking)
        problem = answer_room_problem(thinking, max_tokens, opened=opened) if generated else \
            scoring_problem(thinking) if answer is not None else None
        if problem is not None:
            raise ConfigError(problem)
        if not generated and answer is not None and thinking is not None and config.keep_thinking \
                and not self._said_nothing_to_keep:  # once: a pool makes a call's settings with each new variant
            self._said_nothing_to_keep = True
            log.warning("keep_thinking: the choices are scored by log-likelihood after an empty thinking block, "
                        "so no answer has thinking to keep")
        if answer is not None and answer.choices:  # room for the thinking, then the longest choice
            room = thinking_room(thinking, max_tokens)
            max_tokens = min(max_tokens, room + choice_tokens(max_tokens, answer.choices))
        return GenerationParams(max_tokens, stop, config.ignore_eos, config.sampling, answer=answer,
                                thinking=thinking, token_logprobs=config.token_logprobs)

    def restart_tokenizer(self) -> None:
        """A new tokenizer process in place of one that died (killed from outside: the kernel's
        out-of-memory killer); a warm pool outlives it."""
        self.tokenizer.restart()

    def close(self) -> None:
        """The vocabulary's memory goes back; idempotent."""
        self.tokenizer.close()

    def __enter__(self) -> "Prompting":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def template_opens_block(builder: PromptBuilder, thinking: Thinking) -> bool:
    """Whether the chat template opens the model's thinking block (runner/config/reasoning.py
    block_opened), as a prompt of one user message shows; one that cannot be rendered alone is
    taken as opening it (the room check then asks the least)."""
    try:
        return block_opened(builder.render("?"), thinking)
    except ConfigError:
        return True


def chat_template(config: JobConfig, model_template: Optional[str]) -> tuple[Optional[str], str]:
    """(template text or None for the plain one, which: "model", "plain" or "job")."""
    if config.chat_template == "auto":
        return (model_template, "model") if model_template else (None, "plain")
    if config.chat_template == "plain":
        return None, "plain"
    return config.chat_template, "job"


def _hparams(model_path: str) -> Optional[dict[str, HParam]]:
    """The header's hyper-parameters for the memory plan; None (every layer counted as attention,
    said in the log) where the header cannot be read as llama.cpp did."""
    try:
        return read_hparams(model_path)
    except (OSError, GGUFFormatError) as e:
        log.warning("%s: the memory plan counts every layer as attention (%s)", model_path, e)
        return None
