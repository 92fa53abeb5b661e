"""Turning a record into the exact prompt text the model sees. Pure: no model needed.

The user message comes from the job's `prompt.template` (Jinja over the record's fields, default:
the question). The chat template is the model's own (GGUF `tokenizer.chat_template`), rendered
with Jinja2 in a sandbox as Hugging Face does; models without one get PLAIN_TEMPLATE.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ConfigError, quote
from ..files.formats.openai_checks import messages

PLAIN_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}\n\n"
    "{% elif m.role == 'user' %}Question: {{ m.content }}\n"
    "{% elif m.role == 'assistant' %}Answer: {{ m.content }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Answer:{% endif %}"
)
# A model on the plain template would otherwise go on to invent the next question.
PLAIN_STOP = ("\nQuestion:",)


class ChatTemplateError(ConfigError):
    """The chat template refused these messages (its raise_exception, say roles out of order)."""


class TemplateFieldError(ConfigError):
    """prompt.template names a field this record does not have; the caller says which record."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


# What a template's own Python code may raise on values it did not expect (`{{ n + 1 }}` on a
# CSV's text): the template's fault, told as its Jinja errors are, never a traceback.
TEMPLATE_FAULTS = (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError, AttributeError,
                   RecursionError)
PROBE = "?"  # the user message the chat template is tried with as the job starts


class _Missing(jinja2.UndefinedError):
    """Jinja's error for an undefined name, and where it was looked for: `obj` is
    jinja2.utils.missing for a variable, else the value whose attribute or key `name` is not."""

    def __init__(self, message: Optional[str] = None, obj: Any = jinja2.utils.missing, name: Any = None) -> None:
        super().__init__(message)
        self.obj, self.name = obj, name


class _FieldUndefined(jinja2.StrictUndefined):
    """StrictUndefined whose error says where the name was looked for (_Missing)."""

    __slots__ = ()

    def __init__(self, hint: Optional[str] = None, obj: Any = jinja2.utils.missing, name: Optional[str] = None,
                 exc: Any = None) -> None:
        super().__init__(hint, obj, name, functools.partial(_Missing, obj=obj, name=name))  # type: ignore[arg-type]


def _environment(strict: bool = False) -> ImmutableSandboxedEnvironment:
    # The user's prompt template is strict: a misspelt field must be an error, not an empty
    # string that gives every question the same prompt (and, deduplicated, the same answer).
    # Chat templates are not: they test optional variables (tools, documents) by truthiness.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[jinja2.ext.loopcontrols],
                                       undefined=_FieldUndefined if strict else jinja2.Undefined)
    # Hugging Face renders tojson without ASCII escaping; templates rely on it.
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    return env


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _user_template(source: str) -> jinja2.Template:
    """The user message template, checked once: it must parse, and it must use the record (a
    template naming no variable renders every question identically). A null field it writes is
    an error, as a missing one is (Jinja would write "None"); `{% if field %}` may test it."""
    env = _environment(strict=True)
    env.finalize = _not_null
    try:
        fields = jinja2.meta.find_undeclared_variables(env.parse(source))
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"prompt.template: line {exc.lineno}: {exc.message}") from None
    if not fields:
        raise ConfigError("prompt.template uses no field of the record, so every question would get "
                          f"the same prompt: {quote(source)}")
    return env.from_string(source)


def check_templates(prompt_template: Optional[str], chat_template: Optional[str], system: Optional[str] = None) -> None:
    """ConfigError naming prompt.template, or prompt.chat_template given as a template's text (not
    auto or plain), when it cannot be parsed or would be refused as a job starts (PromptBuilder);
    that needs no model, so a caller that starts the model in the background (Pool.starting)
    hears of it at once."""
    if prompt_template is not None:
        _user_template(prompt_template)
    if chat_template not in (None, "auto", "plain"):
        PromptBuilder(chat_template, system, template_key="prompt.chat_template")


def _chat_template(source: str, key: str) -> jinja2.Template:
    """The chat template, checked once: it must parse, and it must read `messages`, or every
    question would get the same prompt (its text as it is: a file's name, a word)."""
    env = _environment()
    try:
        names = jinja2.meta.find_undeclared_variables(env.parse(source))
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{key}: line {exc.lineno}: {exc.message}") from None
    if "messages" not in names:
        raise ConfigError(f"{key} reads no messages, so every question would get the same prompt: "
                          f"{quote(source)}{_path_hint(source)}")
    return env.from_string(source)


def _path_hint(source: str) -> str:
    """What to say of a chat template that names a file: its path is not read."""
    text = source.strip()
    looks_like_path = "\n" not in text and (text.endswith((".jinja", ".j2")) or os.path.isfile(text))
    return " (a path is not read: give the template's text)" if looks_like_path else ""


def template_fields(prompt_template: Optional[str], question_field: str) -> frozenset[str]:
    """The record fields a prompt.template names (the default template: the question field);
    a field it reads through `record[...]` is not among them."""
    if prompt_template is None:
        return frozenset([question_field])
    try:
        names = jinja2.meta.find_undeclared_variables(_environment(strict=True).parse(prompt_template))
    except jinja2.TemplateSyntaxError:
        return frozenset([question_field])  # refused by name when the prompt builder is made
    return frozenset(names) - {"record"}


def question_field_read(prompt_template: Optional[str], question_field: str) -> Optional[str]:
    """The field every record must hold as its question text: fields.question, unless the job's
    prompt.template makes the prompt without naming it (`{{ record["Prompt Text"] }}`, other
    fields): then None, and a field the template does read is checked as each prompt is made."""
    return question_field if question_field in template_fields(prompt_template, question_field) else None


def _not_null(value: Any) -> Any:
    if value is None:
        raise jinja2.TemplateError("it writes a null field (JSON null, which would read None): give the field a "
                                   "text, or write it only {% if %} it has one")
    return value


def _missing_error(exc: _Missing, fields: Mapping[str, Any]) -> ConfigError:
    """A name prompt.template reads that this record lacks: a field of the record (a variable,
    or `record[...]`: TemplateFieldError, which the caller says with the record's fields), or a
    key inside one of its fields, said as that field's."""
    if exc.obj is jinja2.utils.missing or exc.obj is fields:
        return TemplateFieldError(f"prompt.template: {exc}", str(exc.name))
    owner = next((name for name, value in fields.items() if value is exc.obj), None)
    if owner is None:  # deeper down: Jinja's own words ("'dict object' has no attribute 'x'")
        return ConfigError(f"prompt.template: {exc}")
    return ConfigError(f"prompt.template: field '{owner}' has no key '{exc.name}'")


def _own(exc: ChatTemplateError, key: str) -> str:
    """A template's own words for what it refused, without the key its error begins with."""
    return str(exc).removeprefix(f"{key}: ")


def _text(exc: BaseException) -> str:
    """An error's one line (a Python error may have no message: KeyError())."""
    return str(exc) or type(exc).__name__


def open_final(rendered: str, final: str, key: str = "chat template") -> str:
    """The rendered conversation cut right after its last message's text, dropping what the
    template closes it with, by transformers' rule for continue_final_message: the message's
    trailing whitespace kept where the template wrote it, else the text up to its last
    non-space character."""
    if not final.strip():  # nothing to find: transformers keeps the whole text too
        return rendered
    at = rendered.rfind(final.strip())
    if at < 0:
        raise ChatTemplateError(f"{key}: the last message's text does not appear in what the template "
                                "writes, so the message cannot be left open")
    kept = rendered[at:at + len(final.lstrip())] == final
    return rendered[:at + len(final.lstrip() if kept else final.strip())]


class PromptBuilder:
    def __init__(self, chat_template: Optional[str], system: Optional[str] = None,
                 user_template: Optional[str] = None, question_field: str = "question",
                 bos_token: str = "", eos_token: str = "",
                 template_kwargs: Optional[Mapping[str, Any]] = None, template_key: str = "chat template") -> None:
        # template_key: what its errors begin with, the job key where the job gave the template
        # (so that a job file or call is named before it, as for any key's error)
        self.template_key = template_key
        self.is_plain = chat_template is None
        self._source = chat_template or PLAIN_TEMPLATE
        self._chat = _chat_template(self._source, template_key)
        # the default user message is the question field's text as it is: no template, so a field
        # of any name works ("Prompt Text", "1q": a CSV column's), which Jinja could not name; an
        # empty prompt.template is a template (one using no field, refused), not the default
        self._user = _user_template(user_template) if user_template is not None else None
        self.system = system
        self.question_field = question_field
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.template_kwargs = dict(template_kwargs or {})
        self.writes_system: Optional[bool] = None
        self.writes_system = self._writes_system(bool((system or "").strip()))

    def _writes_system(self, job_system: bool) -> Optional[bool]:
        """Whether the chat template writes a system message's text, as a conversation of one (the
        job's system prompt, or a probe) and a user message shows; None where it refuses that
        conversation (its raise_exception: an OpenAI Batch line holding one then fails saying so).
        The job's own system prompt is refused here, where the template drops or refuses it: every
        prompt holds it, so every question would be answered without it, or fail."""
        text = (self.system or "").strip() or "ggbatch system probe"
        try:
            writes = text in self.render_messages((("system", text), ("user", PROBE)))
        except ChatTemplateError as exc:
            if job_system:
                said = _own(exc, self.template_key)
                raise ConfigError(f"system: the {self.template_key} refuses a system message ({said}), so every "
                                  "question would fail: put the system prompt in prompt.template, or use a chat "
                                  "template with a system role") from None
            return None
        if job_system and not writes:
            raise ConfigError(f"system: the {self.template_key} writes no system message, so the system prompt would "
                              "be dropped from every prompt: put it in prompt.template, or use a chat template with a "
                              "system role")
        return writes

    def system_problem(self, messages: Sequence[tuple[str, str]]) -> Optional[str]:
        """Why a conversation's own system message cannot be honoured: the chat template writes
        none, so it would be dropped without a word (an OpenAI Batch line's, refused as asked)."""
        if self.writes_system is False and any(role == "system" for role, _ in messages):
            return f"{self.template_key} writes no system message, so this conversation's would be dropped"
        return None

    def conversation(self, fields: Mapping[str, Any]) -> Optional[tuple[tuple[str, str], ...]]:
        """The record's conversation, (role, text) turns, where its question is a list of messages
        (checked as the file was read: runner/files/inputs.py) and no prompt.template makes the
        user message; else None."""
        question = fields.get(self.question_field) if self._user is None else None
        return messages(self.question_field, question) if isinstance(question, list) else None

    def user_message(self, fields: Mapping[str, Any]) -> str:
        if self._user is None:
            question: str = fields[self.question_field]  # a string: record_at checked it
            return question
        try:
            # `record` names the whole record, for a field Jinja cannot name: {{ record["Prompt Text"] }};
            # it is the record even where the record has a field of that name
            return self._user.render({**fields, "record": fields})
        except _Missing as exc:
            raise _missing_error(exc, fields) from None
        except TEMPLATE_FAULTS as exc:
            raise ConfigError(f"prompt.template: {_text(exc)}") from None

    def render(self, user_message: str) -> str:
        """The prompt for one user message (after the job's system prompt, if any)."""
        return self.render_messages((("user", user_message),))

    def render_messages(self, messages: Sequence[tuple[str, str]], continue_final: bool = False) -> str:
        """The prompt for a conversation of (role, content) turns, ready for the assistant's
        answer; continue_final: ending right after the last turn's text instead, left open for the
        model to continue (Hugging Face's continue_final_message). The job's system prompt goes
        first unless the conversation has its own."""
        turns = [{"role": role, "content": content} for role, content in messages]
        if self.system and not any(role == "system" for role, _ in messages):
            turns.insert(0, {"role": "system", "content": self.system})
        try:
            text = self._chat.render(messages=turns, add_generation_prompt=not continue_final,
                                     bos_token=self.bos_token, eos_token=self.eos_token,
                                     raise_exception=_raise,
                                     strftime_now=lambda f: datetime.now().strftime(f),
                                     **self.template_kwargs)
        except TEMPLATE_FAULTS as exc:
            raise ChatTemplateError(f"{self.template_key}: {_text(exc)}") from None
        return open_final(text, turns[-1]["content"], self.template_key) if continue_final and turns else text

    def fingerprint(self) -> str:
        """What a conversation is written with, as a short hash (the template, the system prompt,
        the template's arguments): prompts kept from a builder of another fingerprint are stale."""
        key = json.dumps([self._source, self.system, self.template_kwargs, self.bos_token, self.eos_token],
                         sort_keys=True, default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def needs_bos(self, prompt: str) -> bool:
        """Whether the tokenizer should add BOS: not when the template already wrote it."""
        return not (self.bos_token and prompt.startswith(self.bos_token))
