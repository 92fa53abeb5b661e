"""A call's own settings on a warm pool: max_tokens, sampling, choices, a JSON schema or a
grammar, the system prompt. Each call's settings are the pool's with the call's overrides laid
over them, checked as a job's keys are (runner/config/schema.py build_config); a call that
changes what the answer must be replaces the pool's choices, schema or grammar. The workers'
engines keep the pool's settings: a call's questions carry theirs (Question.generation), and
a changed system prompt changes the prompts only, so the shared prefix the workers hold is still
reused as far as a prompt agrees with it (workers/slot_kv.py).
"""

from __future__ import annotations

import json
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ...workers.protocol import GenerationParams
from ..config.answer import job_answer
from ..config.keys import SCHEMA
from ..config.keywords import check_keywords, settings_layer
from ..config.schema import JobConfig, build_config
from ..errors import ConfigError
from ..questions.prompting import Prompting
from ..questions.prompts import PromptBuilder

# keyword -> the job key it sets
OVERRIDES = {"max_tokens": "max_tokens", "sampling": "sampling", "choices": "answer__choices",
             "schema": "answer__json_schema", "json_schema": "answer__json_schema", "grammar": "answer__grammar",
             "system": "system"}
ANSWER_KEYS = ("answer.choices", "answer.json_schema", "answer.grammar")
CACHED = 64  # distinct override sets whose builder and settings are kept

# the job's keys that name files: a pool takes questions and gives answers
POOL_OWN = ("input", "output", "input_format", "output_format", "errors_output", "shard", "report")
SOURCE = "ggbatch.Pool()"  # how errors name a pool made by its constructor


def pool_config(model: str, settings: dict[str, Any]) -> tuple[JobConfig, dict[str, Any]]:
    """(the pool's job settings, its settings layer) from Pool()'s keywords: ConfigError naming a
    key that is not one. A call's own are laid over them (Variants)."""
    check_keywords(SOURCE, settings, POOL_OWN)
    # input and output are placeholders: a pool has no files
    layer = settings_layer({"model": model, "input": "-", "output": "-", **settings}, SOURCE)
    return build_config([(SOURCE, layer)]), layer


@dataclass(frozen=True)
class Variant:
    """What a call's questions are made with."""

    config: JobConfig
    builder: PromptBuilder
    generation: GenerationParams
    own: bool  # its generation differs from the pool's: each question carries it


class Variants:
    """The pool's settings and each call's variant of them, made once per distinct overrides."""

    def __init__(self, layer: Mapping[str, Any], source: str, config: JobConfig, prompting: Prompting,
                 tokenizer_lock: threading.RLock) -> None:
        self._layer, self._source, self._prompting = dict(layer), source, prompting
        self.default = Variant(config, prompting.builder, prompting.generation, False)
        self._made: dict[str, Variant] = {}
        # The tokenizer process checks a call's choices: the pool's lock on it, which its calls'
        # prompts take too (one pipe: two threads' requests must not interleave).
        self._lock = tokenizer_lock

    def of(self, overrides: Mapping[str, Any], where: str) -> Variant:
        """The variant of these overrides (none: the pool's); ConfigError naming the keyword."""
        if not overrides:
            return self.default
        for name in overrides:
            sampled = name.removeprefix("sampling__")
            if name not in OVERRIDES and f"sampling.{sampled}" in SCHEMA:
                raise ConfigError(f"{where}: {name}= is a sampling setting: a call gives it as "
                                  f"sampling={{{sampled!r}: ...}}")
            if name not in OVERRIDES:
                raise ConfigError(f"{where}: {name}= cannot change per call; a call may change "
                                  f"{', '.join(sorted(OVERRIDES))}")
        key = json.dumps(overrides, sort_keys=True, default=repr)
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._make(overrides, where)
                if len(self._made) >= CACHED:
                    self._made.pop(next(iter(self._made)))
                self._made[key] = made
        return made

    def _make(self, overrides: Mapping[str, Any], where: str) -> Variant:
        call = settings_layer({OVERRIDES[k]: v for k, v in overrides.items()}, where)
        base = self._layer
        if any(k in call for k in ANSWER_KEYS):
            base = {k: v for k, v in base.items() if k not in ANSWER_KEYS}
        try:
            config = build_config([(self._source, base), (where, call)])
        except ConfigError as exc:
            # A key's own error names the call; one between keys (sampling.n with choices) names
            # none, and the pool's own settings passed these checks: it is the call's too.
            said = str(exc)
            said = said[len(where) + 2:] if said.startswith(f"{where}: ") else said
            raise ConfigError(f"{where}: {said_as_keywords(said, overrides)}") from None
        with said_by_call(where, overrides):  # a schema or grammar is checked only as it is used
            answer = job_answer(config)
            generation = self._prompting.generation_for(config, answer)
        builder = (self._prompting.builder if config.system == self.default.config.system
                   else self._prompting.builder_for(config))
        return Variant(config, builder, generation, generation != self.default.generation)


@contextmanager
def said_by_call(where: str, overrides: Mapping[str, Any]) -> Iterator[None]:
    """A ConfigError about a call's setting, found as it is used (a schema that is no grammar,
    a grammar llama.cpp refuses), named after the call and the keyword it gave, as a keyword's
    own error is: `ggbatch.Pool.answer(): schema: ...`, not the job key `answer.json_schema: ...`.
    Another refusal (the script's missing `__main__` guard) is not the call's: left as it is."""
    try:
        yield
    except ConfigError as exc:
        said = str(exc)
        if type(exc) is not ConfigError or not re.match(r"[a-z_]+(\.[a-z_]+)*: ", said):
            raise
        raise ConfigError(f"{where}: {said_as_keywords(said, overrides)}") from None


def said_as_keywords(said: str, overrides: Mapping[str, Any]) -> str:
    """A message whose head names job keys ("answer.grammar: ...", "answer.json_schema and
    answer.grammar: give one of them") said with the call's keywords instead ("grammar: ...",
    "schema= and grammar=: ..."): the caller wrote those, not the job keys."""
    head, sep, rest = said.partition(": ")
    if not sep:
        return said
    names = head.split(" and ")
    given = {key.replace("__", "."): keyword for keyword, key in OVERRIDES.items() if keyword in overrides}
    if not any(name in given for name in names):
        return said
    if len(names) == 1:
        return f"{given[head]}: {rest}"
    return f"{' and '.join(given[n] + '=' if n in given else n for n in names)}: {rest}"
