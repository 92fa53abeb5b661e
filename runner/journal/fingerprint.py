"""A job's fingerprint: everything that decides an answer, written in its journal's header, and
what changed between a journal's and a rerun's (runner/journal/journal.py refuses the rerun,
naming it; runner/merge/ warns of parts answered otherwise)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Mapping, Optional

from ...workers.protocol import AnswerSpec, GenerationParams
from ..config.schema import CHOICES_AUTO, FIRST_TOKEN, LOGLIKELIHOOD, JobConfig, flash_attn_auto
from ..files.formats.own_settings import NEWER_SAMPLING_DEFAULTS
from ..model.identity import ModelIdentity
from ..model.versions import package_version


def fingerprint(config: JobConfig, model: ModelIdentity, generation: GenerationParams,
                template_sha: str) -> dict[str, Any]:
    """Everything that decides an answer; a journal is reused only when all of it is unchanged."""
    flash_auto = flash_attn_auto(config.choice_scoring)
    return {"model": model.digest, "model.n_ctx": "auto" if config.n_ctx is None else config.n_ctx,
            "llama_cpp_python": package_version("llama_cpp_python"),
            "chat_template": template_sha, "system": config.system,
            "prompt.template": config.prompt_template, "fields.question": config.question_field,
            # which field is the id (a journal entry is found by it; the default is left out, so
            # that journals written before it was fingerprinted stay valid)
            **({"fields.id": config.id_field} if config.id_field != "questionID" else {}),
            "prompt.template_kwargs": config.template_kwargs,
            "max_tokens": generation.max_tokens, "stop": list(generation.stop),
            "ignore_eos": generation.ignore_eos, "batch_invariant": config.batch_invariant,
            # flash attention moves logits (log-probabilities, a close pick): set otherwise than
            # auto, it is named (auto left out: journals written before it was fingerprinted stay valid)
            **({"flash_attn": config.flash_attn} if config.flash_attn != flash_auto else {}),
            # fixed choices, a schema's or a job's grammar: an answer made under others is not reused
            "answer": answer_settings(generation.answer),
            # a reasoning model's block and budget: a forced end makes other answers (left out
            # for a model that does not think, whose journals it does not concern)
            **({"reasoning": asdict(generation.thinking)} if generation.thinking is not None else {}),
            # another shard's output holds other questions: refused rather than silently mixed
            "shard": str(config.shard) if config.shard is not None else None,
            # answers without token log-probabilities are not reused when they are asked (only set:
            # journals of jobs that never asked stay valid)
            **({"answer.token_logprobs": generation.token_logprobs} if generation.token_logprobs is not None else {}),
            # choices scored by log-likelihood (the default, first_token, left out: journals written
            # before it existed stay valid)
            **({"answer.choice_scoring": config.choice_scoring} if config.choice_scoring != FIRST_TOKEN else {}),
            # on a model that thinks, scored after an empty thinking block (runner/config/reasoning.py
            # scoring_context); journals that scored inside the open block have no such key, and are refused
            **({"answer.choice_scoring_context": SCORED_AFTER_EMPTY_BLOCK}
               if config.choice_scoring == LOGLIKELIHOOD and generation.thinking is not None else {}),
            # a record's labelled choices scored by their texts where its prompt does not list them
            # (runner/config/answer.py scored_texts); journals that scored the labels have no such key
            **({"answer.labelled_choices": TEXTS_UNLESS_LISTED}
               if config.choice_scoring == LOGLIKELIHOOD and config.choices == CHOICES_AUTO else {}),
            # one sample and no penalties (the defaults) are left out: journals written before
            # those settings existed stay valid
            **{f"sampling.{k}": v for k, v in asdict(generation.sampling).items()
               if k not in NEWER_SAMPLING_DEFAULTS or v != NEWER_SAMPLING_DEFAULTS[k]}}


def answer_settings(answer: Optional[AnswerSpec]) -> Optional[dict[str, Any]]:
    """The job's answer.* settings as its fingerprint holds them: AnswerSpec.texts, a record's
    own (never the job's), is left out, as journals written before it have it."""
    if answer is None:
        return None
    settings = asdict(answer)
    del settings["texts"]
    return settings


# the fingerprint's keys left out at their default (so that older journals stay valid): a change
# names the default rather than null
LEFT_OUT = {"fields.id": "questionID", "answer.choice_scoring": FIRST_TOKEN, "flash_attn": "auto",
            **{f"sampling.{name}": default for name, default in NEWER_SAMPLING_DEFAULTS.items()},
            "answer.choice_scoring_context": "inside the open thinking block",
            "answer.labelled_choices": "their labels"}
SCORED_AFTER_EMPTY_BLOCK = "after an empty thinking block"
TEXTS_UNLESS_LISTED = "their texts, unless the prompt lists them beside their labels"

# What ggbatch itself decides, not a setting: a change is another version's way, said as such
# (`answer.choice_scoring_context` is no key a user sets): (how a version scored, how this one
# scores, how another version scored, said after the first)
RULES = {"answer.choice_scoring_context": ("scored a thinking model's choices", "scores them", "scored them"),
         "answer.labelled_choices": ("scored a record's labelled choices by", "scores them by", "scored them by")}
GRAMMAR = "(answer.json_schema, or answer.grammar)"


def rule_change(key: str, was: Any, now: Any) -> Optional[str]:
    """A change of one of ggbatch's own rules between the version that wrote a journal and this
    one, in words, or of the answer's grammar, which a schema's converted grammar would show as
    pages of GBNF; None for any other setting (named as written)."""
    if key == "answer.grammar":
        return f"the answer's grammar {GRAMMAR} changed since the journaled run"
    if key not in RULES:
        return None
    then, today, _ = RULES[key]
    return f"the ggbatch version that wrote it {then} {was}; this version {today} {now}: its answers are not this one's"


def parts_rule_change(key: str, was: Any, now: Any, first: str, second: str) -> Optional[str]:
    """rule_change between two parts of a merge (`ggbatch merge`), as their journals say it; None
    for any other setting (named as written)."""
    if key == "answer.grammar":
        return f"{first} and {second} were answered with different grammars {GRAMMAR[:-1]}, as their journals say)"
    if key not in RULES:
        return None
    then, _, again = RULES[key]
    return (f"the ggbatch version that answered {first} {then} {was}, and the one that answered {second} "
            f"{again} {now} (as their journals say)")


# the fingerprint's names that are not the job key which sets them: a change names the job key
JOB_KEYS = {"reasoning.budget": "reasoning.max_tokens"}


def as_written(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """A fingerprint as the journal's header holds it, read back: one form to compare, whatever
    spelled the settings (a tuple from the command line, a list from JSON, a dataclass's tuples)."""
    written: dict[str, Any] = json.loads(json.dumps(dict(fingerprint)))
    return written


def changed_setting(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[str]:
    """The first setting whose value differs, or None (setting_change)."""
    change = setting_change(old, new)
    return change[0] if change is not None else None


def setting_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[tuple[str, Any, Any]]:
    """(the first setting whose value differs, its old value, its new one), or None. Both are
    compared as written to a journal; a setting that is a mapping on both sides is named down
    to the key inside it that differs ('reasoning.max_tokens' 3 -> 5, not the whole block), and one
    left out at its default is named with that default. Values are shown as the user wrote them."""
    old, new = as_written(old), as_written(new)
    change = _first_change(old, new)
    if change is None:
        return None
    key, was, now = change
    return JOB_KEYS.get(key, key), _as_given(key, was, old), _as_given(key, now, new)


def _as_given(key: str, value: Any, fingerprint: Mapping[str, Any]) -> Any:
    """answer.choices: auto is journaled as an answer of no choices and no grammar (each question
    takes its record's own choices), which would read as []: it is named auto."""
    answer = fingerprint.get("answer")
    if key == "answer.choices" and value == [] and isinstance(answer, dict) and answer.get("grammar") is None:
        return CHOICES_AUTO
    return value


def _first_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[tuple[str, Any, Any]]:
    """setting_change as the journal holds both, values as written."""
    for key in sorted(set(old) | set(new)):
        was, now = old.get(key, LEFT_OUT.get(key)), new.get(key, LEFT_OUT.get(key))
        if key in old and key in new and isinstance(was, dict) and isinstance(now, dict):
            inner = _first_change(was, now)
            if inner is not None:
                return f"{key}.{inner[0]}", inner[1], inner[2]
        elif old.get(key) != new.get(key):
            return key, was, now
    return None
