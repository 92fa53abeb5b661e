"""What an answer must be, from the job's answer.* keys or an OpenAI line's response_format, as
the worker takes it (AnswerSpec): fixed choices, or a GBNF grammar. A JSON schema becomes GBNF
through llama-cpp-python's converter; every grammar is built once by llama.cpp here, before any
worker starts, so a bad one is one line naming the key (exit 2) or the line's own error.

    answer.choices [A, B] | auto ─▶ AnswerSpec(choices)      (auto: each record's `choices`)
    answer.json_schema {...} | F.json ─▶ GBNF ─▶ AnswerSpec(grammar)
    answer.grammar GBNF ─▶ AnswerSpec(grammar)
    response_format json_object | json_schema ─▶ GBNF (per line)
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence, Union

from ...workers.protocol import AnswerSpec, GenerationParams, ResponseFormat
from ..errors import ConfigError, InputError, quote
from ..files.formats.choices import Choices, read_choices
from .reasoning import thinking_room
from .schema import CHOICES_AUTO, LOGLIKELIHOOD, JobConfig
from .schema_keywords import unenforced_keyword


def job_answer(config: JobConfig) -> Optional[AnswerSpec]:
    """The job's AnswerSpec (None: free text), its grammar checked by llama.cpp; ConfigError
    naming the key when the schema or the grammar cannot be used."""
    logprobs, logits = config.choice_logprobs, config.choice_logits
    if config.choices == CHOICES_AUTO:
        # each question's choices come from its record
        return AnswerSpec(logprobs=logprobs, choice_logits=logits)
    if config.choices:
        return AnswerSpec(tuple(config.choices), logprobs=logprobs, choice_logits=logits)
    if config.json_schema is not None:
        try:
            gbnf = schema_grammar(config.json_schema)
        except ValueError as exc:
            raise ConfigError(f"answer.json_schema: {exc}") from None
        return AnswerSpec(grammar=_checked("answer.json_schema", gbnf))
    if config.grammar is not None:
        return AnswerSpec(grammar=_checked("answer.grammar", config.grammar))
    return None


def check_spellable(tokenizer: Any, choices: tuple[str, ...], unknown_token: Optional[int]) -> None:
    """ConfigError naming the first choice the model's vocabulary cannot write: no answer could
    be that choice, and every question would fail at run time with the grammar's error."""
    refused = unwritable(tokenizer, choices, unknown_token)
    if refused is not None:
        raise ConfigError(f"answer.choices: {quote(refused[0])}: {refused[1]}, so no answer can be this choice")


def check_schema_opener(tokenizer: Any, schema_text: str, unknown_token: Optional[int]) -> None:
    """ConfigError when the model's vocabulary cannot write any character an answer to the job's
    JSON schema may start with ('{' for an object): each question would run, then fail at its
    first token with the grammar's error (a toy vocabulary of a few thousand tokens, without byte
    tokens, may lack them)."""
    openers = schema_openers(schema_text)
    refused = refusals(tokenizer, openers, unknown_token) if openers else []  # one round trip for all
    if refused and all(why is not None for why in refused):
        starts = " or ".join(quote(opener) for opener in openers)
        raise ConfigError(f"answer.json_schema: every answer to it starts with {starts}: {refused[0]}, so no answer "
                          "can be written")


def schema_openers(schema_text: str) -> tuple[str, ...]:
    """The characters a JSON value the schema admits may start with ('{', '[' or '"'), by its
    root's type, through $ref, allOf, anyOf and oneOf, a list of types, const and enum (an
    object's properties mean an object); () where another may (a number, true) or it cannot tell."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return ()
    found = _openers(schema, schema, 0)
    return tuple(sorted(found)) if found and found <= set(OPENERS.values()) else ()


OPENERS = {"object": "{", "array": "[", "string": '"'}


def _openers(node: Any, root: Any, depth: int) -> Optional[set[str]]:
    """The first characters of the values `node` admits; None: any, or not known."""
    if not isinstance(node, dict) or depth > 16:
        return None
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return _openers(target, root, depth + 1)
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"] if isinstance(node["enum"], list) else []
        return {json.dumps(v)[:1] for v in values} or None
    for branch in node.get("allOf") or []:
        found = _openers(branch, root, depth + 1)
        if found is not None:
            return found
    branches = node.get("anyOf") or node.get("oneOf")
    if isinstance(branches, list) and branches:
        each = [_openers(b, root, depth + 1) for b in branches]
        known = [f for f in each if f is not None]
        return set().union(*known) if len(known) == len(each) else None
    kind = node.get("type", "object" if "properties" in node else None)
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    return {OPENERS.get(k, "?") for k in kinds if isinstance(k, str)} or None


UNKNOWN_TOKEN_KEY = "tokenizer.ggml.unknown_token_id"


def unknown_token_id(value: Optional[str]) -> Optional[int]:
    """The vocabulary's unknown token, from its GGUF metadata value (UNKNOWN_TOKEN_KEY, as text);
    None when the model names none."""
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def spelling_problem(tokens: Union[Sequence[int], str], unknown_token: Optional[int]) -> Optional[str]:
    """Why the model's vocabulary cannot write a text, from what its tokenizer made of it (its
    tokens, or a str: why the tokenizer process refused it, such as the characters the vocabulary
    lacks), or None. A tokenizer that reads a character as its unknown token cannot write it
    either. The one rule for the job's choices and schema openers (refusals) and for a record's
    own choices (runner/questions/continuations.py unspellable), so that both refuse alike."""
    if isinstance(tokens, str):
        return tokens
    if unknown_token is not None and unknown_token in tokens:
        return "the model's tokenizer reads a character of it as its unknown token"
    return None


def unwritable(tokenizer: Any, texts: tuple[str, ...], unknown_token: Optional[int]) -> Optional[tuple[str, str]]:
    """(the first text the model's vocabulary cannot write, why), or None."""
    return next(((text, why) for text, why in zip(texts, refusals(tokenizer, texts, unknown_token))
                 if why is not None), None)


def refusals(tokenizer: Any, texts: tuple[str, ...], unknown_token: Optional[int]) -> list[Optional[str]]:
    """Why the model's vocabulary cannot write each text (spelling_problem; None: it can). The
    texts go once through the tokenizer process (runner/questions/tokenizing.py), which says which
    text its vocabulary lacks a character of."""
    tokenizer.submit(texts, [False] * len(texts))
    got = tokenizer.receive()
    start = 0
    out: list[Optional[str]] = []
    for i in range(len(texts)):
        count = max(got.counts[i], 0)
        out.append(spelling_problem(got.errors.get(i, got.tokens[start:start + count]), unknown_token))
        start += count
    return out


def check_logprob_choices(tokenizer: Any, choices: tuple[str, ...]) -> None:
    """answer.logprobs reads each choice's log-probability from the logits of the answer's first
    position, which only choices of one token each are answered from (workers/engine/answers.py);
    with a longer one the answer is generated under a grammar, which gives no such number.
    ConfigError naming the first such choice and what does give it, before any question is made
    (the tokenizer process finds each choice's token as a worker does)."""
    for choice, one in zip(choices, tokenizer.one_token(choices)):
        if not one:
            raise ConfigError(f"answer.logprobs: the choice {quote(choice)} takes more than one of the model's tokens, "
                              "so the answer is generated and no choice has a log-probability (only choices of one "
                              f"token each are read from the logits); answer.choice_scoring: {LOGLIKELIHOOD} "
                              f"(--choice-scoring {LOGLIKELIHOOD}) scores each choice's whole text and writes its sum")


def _checked(key: str, gbnf: str) -> str:
    problem = grammar_problem(gbnf)
    if problem is not None:
        raise ConfigError(f"{key}: not a grammar llama.cpp can use: {quote(problem, 160)}")
    return gbnf


@functools.lru_cache(maxsize=256)
def grammar_problem(gbnf: str) -> Optional[str]:
    """Why llama.cpp cannot parse this GBNF, or None (it is built once and freed)."""
    from ...workers.llama.sampling import grammar_problem as build  # loads llama.cpp: only when needed
    return build(gbnf)


@functools.lru_cache(maxsize=256)
def schema_grammar(schema_text: str) -> str:
    """GBNF for JSON valid under this schema (canonical JSON text), by llama-cpp-python's
    converter; ValueError saying why it cannot convert it."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    unenforced = unenforced_keyword(json.loads(schema_text))
    if unenforced is not None:
        raise ValueError(unenforced)
    try:
        return str(json_schema_to_gbnf(schema_text))
    except Exception as exc:  # the converter raises whatever it meets; one line says it
        raise ValueError(f"cannot turn this JSON schema into a grammar ({type(exc).__name__}: {exc})") from None


@functools.lru_cache(maxsize=256)
def format_grammar(fmt: ResponseFormat) -> str:
    """GBNF for an OpenAI response_format: any JSON object, or JSON valid under its schema;
    ValueError naming the field when it cannot be enforced."""
    if fmt.type == "json_object" or fmt.schema is None:
        from llama_cpp.llama_grammar import JSON_GBNF
        return JSON_GBNF
    try:
        gbnf = schema_grammar(fmt.schema)
    except ValueError as exc:
        raise ValueError(f"body.response_format: json_schema.schema: {exc}") from None
    problem = grammar_problem(gbnf)
    if problem is not None:
        raise ValueError(f"body.response_format: json_schema.schema: llama.cpp cannot use its grammar ({problem})")
    return gbnf


def record_choices(fields: Mapping[str, Any], where: str, qid: str) -> Choices:
    """A record's own choices (answer.choices: auto), in any shape runner/files/formats/choices.py
    reads, read once: answered by their labels (MMLU's {"A": "4", "B": "8"} and ARC's
    {"text": [...], "label": [...]} give A, B) or the texts of a bare list (Choices.answered),
    and scored by what scored_texts finds of them in the prompt."""
    read = read_choices(fields.get("choices"))
    if read is None:
        got = f", got {quote(fields['choices'], 80)}" if "choices" in fields else ""
        value = fields.get("choices")
        if isinstance(value, Mapping) and set(value) == {"text", "label"}:
            raise InputError(f"{where}: record '{qid}': its 'choices' must hold as many labels as texts, each a list "
                             f"(answer.choices: auto){got}")
        raise InputError(f"{where}: record '{qid}' has no 'choices' mapping or list (answer.choices: auto){got}")
    items = read.answered
    # Equal texts (real MMLU rows have them) are scored alike and the first of them is the
    # answer; equal labels would leave the answer's choice unknown.
    if not all(items) or not all(read.texts) or (read.labels is not None and len(set(items)) != len(items)):
        raise InputError(f"{where}: record '{qid}': choices must be non-empty strings, labels distinct "
                         f"(answer.choices: auto), got {quote(json.dumps(fields['choices']), 80)}")
    return read


def scored_texts(read: Choices, prompt: str) -> tuple[str, ...]:
    """What a record's own labelled choices (MMLU's mapping, ARC's text and label) are scored as
    by log-likelihood: their texts, when its prompt does not list each text beside its label
    (ARC and OpenBookQA, whose texts lm-eval scores), so that no label stands for text the model
    has not read; () when it lists them (MMLU's "A. 4", whose letters lm-eval scores), or the
    choices are a bare list (the texts are the choices)."""
    if read.labels is None:
        return ()
    listed = all(re.search(rf"(?<!\w){re.escape(label)}(?:\s*[.):\]-]\s*|\s+){re.escape(text)}", prompt)
                 for label, text in zip(read.labels, read.texts))
    return () if listed else read.texts


def with_choices(gen: GenerationParams, choices: tuple[str, ...], texts: tuple[str, ...] = ()) -> GenerationParams:
    """The job's settings for a question of its own choices (answer.choices: auto), scored as
    `texts` where they are not the choices themselves (scored_texts)."""
    assert gen.answer is not None
    return room_for_choices(replace(gen, answer=replace(gen.answer, choices=choices, texts=texts)), gen.max_tokens)


def room_for_choices(gen: GenerationParams, max_tokens: int) -> GenerationParams:
    """The settings with `max_tokens` (as asked) cut to the room their thinking needs plus the
    longest of their fixed choices, as a job's are (runner/questions/prompting.py generation_for);
    unchanged without choices."""
    if gen.answer is None or not gen.answer.choices:
        return gen
    room = thinking_room(gen.thinking, max_tokens)
    return replace(gen, max_tokens=min(max_tokens, room + choice_tokens(max_tokens, gen.answer.choices)))


def choice_tokens(max_tokens: int, choices: tuple[str, ...]) -> int:
    """The most tokens an answer among these choices can take: every token a grammar lets through
    writes a byte or more, so the longest choice's bytes and its leading space, plus one for the
    end of generation. The context is sized for it, not for the job's max_tokens."""
    return min(max_tokens, max(len(c.encode("utf-8")) for c in choices) + 2) if choices else max_tokens
