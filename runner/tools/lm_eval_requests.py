"""What ggbatch's lm-eval model (ggbatch.lm_eval.GgbatchLM) makes of lm-eval's requests and
model_args, without lm-eval itself: a request cut to max_length as lm-eval's Hugging Face and vLLM
models cut it, generation kwargs as ggbatch's settings, a sampled request's seed, how an error
names a request, and the checks of max_length and --device."""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ...workers.protocol import GenerationParams, SamplingParams
from ..config.keys import SCHEMA
from ..config.keywords import key_parts, keywords
from ..errors import ConfigError, InputError, quote
from ..model.gguf_header import GGUFFormatError, read_hparams
from ..questions.maker import question_seed
from ..warm.overrides import POOL_OWN

log = logging.getLogger("ggbatch")


def request_names(requests: Sequence[Any]) -> list[str]:
    """How an error names each request of a call: lm-eval's task and doc, where it gives them."""
    names = []
    for i, req in enumerate(requests):
        task, doc = getattr(req, "task_name", None), getattr(req, "doc_id", None)
        names.append(f"task {task!r} doc {doc}" if task is not None else f"request {i + 1} of {len(requests)}")
    return names


def scored_window(context: list[int], continuation: list[int], max_length: int,
                  name: str) -> tuple[list[int], list[int]]:
    """(context, continuation) cut from the left as lm-eval's Hugging Face model cuts a request:
    (context + continuation)[-(max_length + 1):], the continuation whole, max_length tokens fed
    (its last is not); a continuation longer than max_length cannot be scored so."""
    if len(continuation) > max_length:
        raise InputError(f"ggbatch.lm_eval: {name}: its continuation has {len(continuation)} tokens, more than "
                         f"max_length={max_length}: it cannot be scored within the model's context")
    if not continuation:  # scored without the model: any context will do
        return context[-max_length:], continuation
    whole = (context + continuation)[-(max_length + 1):]
    return whole[:len(whole) - len(continuation)], continuation


def generation_window(tokens: array[int], max_gen_toks: int, max_length: int) -> tuple[array[int], int]:
    """(the context's tokens kept, the most tokens to generate) within max_length: lm-eval's vLLM
    and Hugging Face models' rule, the context's last max_length - max_gen_toks tokens; when
    max_gen_toks leaves no room (HF refuses that), lm-eval's maybe_truncate(shrink_gen_toks) rule:
    the context up to max_length - 1 tokens, and what room is left to generate."""
    if len(tokens) + max_gen_toks <= max_length:
        return tokens, max_gen_toks
    if max_gen_toks < max_length:
        return tokens[len(tokens) - (max_length - max_gen_toks):], max_gen_toks
    kept = tokens[len(tokens) - max(1, min(len(tokens), max_length - 1)):]
    return kept, max(1, max_length - len(kept))


def say_cut(what: str, cut: int, total: int, how: str) -> None:
    """One warning a call for the requests it cut to fit max_length."""
    if cut:
        log.warning("ggbatch.lm_eval: %d of %d %s requests are longer than max_length and keep %s, as lm-eval's "
                    "Hugging Face and vLLM models cut them", cut, total, what, how)


def say_shrunk(shrunk: int, total: int, max_length: int) -> None:
    """One warning a call for the generate_until requests whose max_gen_toks left their context no
    room (generation_window's second rule): their answers are shorter than they asked."""
    if shrunk:
        log.warning("ggbatch.lm_eval: %d of %d generate_until requests ask for max_gen_toks of max_length (%d) or "
                    "more: each keeps at most its context's last %d tokens and generates in the room left, as few as "
                    "1 token (lm-eval's maybe_truncate rule)", shrunk, total, max_length, max_length - 1)


def unanswered(what: str, name: str, error: Optional[str]) -> InputError:
    """The one-line error that ends a run where a request could not be answered."""
    return InputError(f"ggbatch.lm_eval: {name} ({what}) could not be answered: {error or 'no answer came back'}")


def request_seeds(job_seed: int, requests: Sequence[tuple[Any, tuple[Any, ...]]]) -> list[int]:
    """Each generate_until request's sampling seed, from the settings' sampling.seed and what the
    request is (its context and gen_kwargs), and a repeat of one request (lm-eval sends a task's
    `repeats` as copies of one instance) by its place among its copies: a document's sample stays
    the same under another --limit, --samples or mix of tasks, and documents with the same prompt
    get the same samples. `requests`: (the request's identity, such as lm-eval's task, document and
    index, its args); copies of one identity are its repeats."""
    seen: dict[tuple[Any, str], int] = {}
    seeds = []
    for identity, (context, gen_kwargs) in requests:
        digest = hashlib.sha256(json.dumps([context, gen_kwargs], sort_keys=True, default=str).encode()).hexdigest()
        seen[identity, digest] = seen.get((identity, digest), -1) + 1
        seeds.append(question_seed(job_seed, f"{digest}:{seen[identity, digest]}"))
    return seeds


def request_identity(request: Any) -> Any:
    """What tells lm-eval's copies of one request (its `repeats`) from another document's request
    with the same prompt: its task, document and index; None where it gives none (all the
    call's equal requests are then repeats of one)."""
    task = getattr(request, "task_name", None)
    return None if task is None else (task, getattr(request, "doc_id", None), getattr(request, "idx", None))


def setting(settings: Mapping[str, Any], section: str, key: str) -> Any:
    """A job key among the keyword arguments, however it is spelled (model__n_ctx, model.n_ctx,
    model={"n_ctx": ...}); None when not given."""
    for name, value in settings.items():
        parts = key_parts(name)
        if parts == [section, key]:
            return value
        if parts == [section] and isinstance(value, Mapping):
            return value.get(key)
    return None


# The pool's settings that lm-eval's requests decide for themselves, and what does it instead: each
# request's generation is its task's generation_kwargs (runner/tools/lm_eval_requests.py
# generation_of), what is asked and scored the task's. Given in model_args they would do nothing.
DECIDED_BY_REQUESTS = {
    "max_tokens": "a task's generation_kwargs max_gen_toks (--gen_kwargs max_gen_toks=N)",
    "stop": "a task's generation_kwargs until (--gen_kwargs until=...)",
    "ignore_eos": "a task's generation_kwargs max_gen_toks and until (an answer ends at the model's end of text)",
    "sampling": "a task's generation_kwargs do_sample, temperature, top_k, top_p, min_p and the penalties "
                "(--gen_kwargs do_sample=true,temperature=0.7); only sampling.seed is a model_args setting",
    "answer": "the task's output_type and metrics",
    "fields": "the task's doc_to_text and doc_to_target",
    "reasoning": "lm-eval's requests (an answer is the model's text as generated; a task's filters take the answer "
                 "from it)",
    "keep_thinking": "lm-eval's requests (an answer is the model's text as generated; a task's filters take the "
                     "answer from it)",
    # the requests come as text, written by the task (or lm-eval's chat template): never ggbatch's prompt
    "prompt.template": "the task's doc_to_text (with --system_instruction and --apply_chat_template)",
}
# Settings only the chat template writes with: they apply to lm-eval's --apply_chat_template alone
CHAT_ONLY = ("system", "prompt.chat_template", "prompt.template_kwargs")
# GgbatchLM's own keyword arguments beside the pool's settings (lm-eval's names)
LM_KEYWORDS = ("model", "pretrained", "max_length", "batch_size", "max_batch_size", "device")


def check_model_args(settings: Mapping[str, Any]) -> None:
    """ConfigError, named as lm-eval's model_args, for a key that is no setting of the model
    (the one meant, among the pool's keys and lm-eval's own: max_length) or one that lm-eval's
    requests decide, which would do nothing (DECIDED_BY_REQUESTS)."""
    valid = sorted({k for k in keywords() if k not in POOL_OWN and k not in DECIDED_BY_REQUESTS} | set(LM_KEYWORDS))
    for name, value in settings.items():
        parts = key_parts(name)
        top = parts[0]
        if name == "engine_factory":  # Pool's from Python (a test's fake engine), no setting
            continue
        if top == "sampling":
            given = parts[1:] or (list(value) if isinstance(value, Mapping) else [""])
            if all(leaf == "seed" for leaf in given):
                continue
        if top != "seed" and f"sampling.{top}" in SCHEMA:  # temperature= meant sampling.temperature
            top = "sampling"
        if "prompt.template" in given_keys(name, value, "prompt"):
            top = "prompt.template"
        if top in DECIDED_BY_REQUESTS and top not in LM_KEYWORDS:
            shown = top if parts == ["prompt"] else name  # prompt={"template": ...}: the key meant
            raise ConfigError(f"ggbatch.lm_eval model_args: {shown} is not used: lm-eval's requests decide it, "
                              f"through {DECIDED_BY_REQUESTS[top]}")
        if top in POOL_OWN:
            raise ConfigError(f"ggbatch.lm_eval model_args: {name} is not used: lm-eval's tasks give the questions "
                              "and it writes the results (--output_path)")
        if top not in valid:
            raise ConfigError(f"ggbatch.lm_eval model_args: {unknown_model_arg(name, valid)}")


def unknown_model_arg(name: str, valid: list[str]) -> str:
    """The words for a key that is no model_arg: the one meant, where it is a key model_args takes
    (a closer one it refuses, such as temprature's sampling.temperature, gives none: unknown_key's
    hint ranges over every job key), and the keys model_args takes."""
    tops = [*valid, "sampling.seed"]
    accepted = {key for key in SCHEMA if key.split(".")[0] in valid and key not in DECIDED_BY_REQUESTS} | set(tops)
    leaves = {key.split(".")[-1]: key for key in SCHEMA if "." in key}
    top = key_parts(name)[0]
    # a key inside a section by its own name first (n_gpu_layers: model.n_gpu_layers), then typos
    hint = ([leaves[top]] if top in leaves else difflib.get_close_matches(top, [*keywords(), *tops], n=1)
            or [leaves[leaf] for leaf in difflib.get_close_matches(top, list(leaves), n=1)])
    said = f" (did you mean '{hint[0]}'?)" if hint and hint[0] in accepted else ""
    return f"unknown key '{name.replace('__', '.')}'{said}; the keys: {', '.join(sorted(tops))}"


def given_keys(name: str, value: Any, section: str) -> list[str]:
    """The dotted job keys a keyword argument gives within `section` (prompt={"template": ...}
    gives prompt.template); none when it is another section's."""
    parts = key_parts(name)
    if parts[0] != section:
        return []
    if len(parts) == 1:
        return [f"{section}.{leaf}" for leaf in value] if isinstance(value, Mapping) else [section]
    return [".".join(parts)]


def chat_only(settings: Mapping[str, Any]) -> list[str]:
    """The settings given that apply to --apply_chat_template alone (CHAT_ONLY), as dotted keys."""
    given = [key for name, value in settings.items() for key in (given_keys(name, value, "prompt")
                                                                 or [".".join(key_parts(name))])]
    return list(dict.fromkeys(key for key in given if key in CHAT_ONLY))  # once each, however spelt


def chat_only_unused(keys: list[str]) -> ConfigError:
    """The refusal of chat-only settings in a run whose requests lm-eval wrote without the chat
    template: they would do nothing there."""
    return ConfigError(f"ggbatch.lm_eval model_args: {', '.join(keys)} applies only to lm-eval's "
                       "--apply_chat_template (the chat template writes it), and these requests were written "
                       "without it: run with --apply_chat_template, or give a system prompt as lm-eval's "
                       "--system_instruction, which applies either way")


def checked_max_length(max_length: Any, path: str, n_ctx: Optional[int]) -> Optional[int]:
    """max_length as a number of tokens: a whole number, 1 or more, within the settings'
    model.n_ctx and the model's training context (read from a local GGUF file's header; a Hub
    model's is checked once it is loaded: GgbatchLM.max_length), as lm-eval's vLLM model refuses
    a max_model_len above the model's. None when not given."""
    if max_length is None:
        return None
    if isinstance(max_length, bool) or not re.fullmatch(r"\s*\d+\s*", str(max_length)) or int(max_length) < 1:
        raise ConfigError(f"ggbatch.lm_eval: max_length must be a whole number of tokens, got {quote(max_length)}")
    if n_ctx is not None and int(max_length) > n_ctx:
        raise ConfigError(f"ggbatch.lm_eval: max_length={int(max_length)} is more than model.n_ctx={n_ctx}, "
                          "the context per sequence the settings give")
    return within_context(int(max_length), local_context(path), path)


def local_context(path: str) -> int:
    """The training context a local GGUF file's header gives (0: not a readable local file, or
    it does not say)."""
    try:
        hparams = read_hparams(path)
    except (OSError, GGUFFormatError):
        return 0
    value = hparams.get(f"{hparams.get('general.architecture')}.context_length")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def within_context(max_length: int, n_ctx_train: int, model: str) -> int:
    """max_length, refused when the model's training context (0: unknown) is shorter."""
    if n_ctx_train and max_length > n_ctx_train:
        raise ConfigError(f"ggbatch.lm_eval: max_length={max_length} is more than the model's context, "
                          f"{n_ctx_train} tokens ({Path(model).name})")
    return max_length


def device_settings(device: Optional[str], settings: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's --device as ggbatch's settings, where the settings say nothing of the GPU
    themselves: `cpu` no layer on a GPU (ggbatch's own default without `devices`), `cuda`,
    `cuda:N` or `mps` every layer on the GPU llama.cpp picks (which GPU is `devices`' or
    CUDA_VISIBLE_DEVICES' to say); anything else, or none, nothing."""
    said = any(key_parts(k)[-1] == "n_gpu_layers" or k == "devices" for k in settings)
    if said or not device:
        return {}
    if device == "cpu":
        return {"model__n_gpu_layers": 0}
    return {"model__n_gpu_layers": "all"} if re.fullmatch(r"cuda(:\d+)?|mps", device) else {}


# lm-eval's gen_kwargs that have a ggbatch setting, beside until and max_gen_toks (Hugging Face's
# names, as task YAMLs write them), and what each becomes when sampling
SAMPLING_KWARGS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                   "repetition_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
                   "frequency_penalty": "frequency_penalty"}
# lm-eval's names for the most tokens to generate, the first given winning: its own models' rule
# (lm_eval/models/utils.py normalize_gen_kwargs, 0.4.13, used by its Hugging Face, vLLM and TRT-LLM
# models; mirrored, as this module runs without lm-eval and the function came after 0.4.10).
MAX_TOKEN_ALIASES = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
KNOWN_KWARGS = {"until", "do_sample", *MAX_TOKEN_ALIASES, *SAMPLING_KWARGS}


def generation_of(gen_kwargs: dict[str, Any], name: str = "a request") -> GenerationParams:
    """lm-eval's gen_kwargs as ggbatch's settings: until (a string or a list), max_gen_toks (or
    one of its aliases: _max_gen_toks), and greedy unless a temperature above 0 asks for sampling
    (do_sample true or not given, as lm-eval's models take it), then with top_k (none unless
    given), top_p, min_p, repetition_penalty, presence_penalty and frequency_penalty where given.
    Others are said once in the log and not used. A value that is not a number is refused in one
    line naming it and the request (`name`)."""
    until = gen_kwargs.get("until") or ()
    stop = (until,) if isinstance(until, str) else tuple(until)
    unknown = sorted(set(gen_kwargs) - KNOWN_KWARGS - _said)
    if unknown:
        _said.update(unknown)
        log.warning("ggbatch.lm_eval: generation_kwargs %s have no ggbatch setting and are not used", unknown)
    # No top-k unless the task gives one: lm-eval's vLLM model applies none (SamplingParams' 40 is
    # ggbatch's own default for its jobs, which no task asked for)
    sampling = SamplingParams(top_k=0)
    do_sample = gen_kwargs.get("do_sample")
    # lm-eval's rule (normalize_gen_kwargs): do_sample not given samples when the temperature is above 0
    if (do_sample is None or do_sample) and _number(gen_kwargs, "temperature", float, name, 0.0) > 0.0:
        given = {ours: _number(gen_kwargs, theirs, type(getattr(sampling, ours)), name)
                 for theirs, ours in SAMPLING_KWARGS.items() if gen_kwargs.get(theirs) is not None}
        sampling = replace(sampling, **given)
    return GenerationParams(max_tokens=_max_gen_toks(gen_kwargs, name), stop=stop, sampling=sampling)


def _max_gen_toks(gen_kwargs: Mapping[str, Any], name: str) -> int:
    """The most tokens to generate: the first of MAX_TOKEN_ALIASES given (several: said once, as
    lm-eval says it), else lm-eval's default, 256."""
    given = [alias for alias in MAX_TOKEN_ALIASES if gen_kwargs.get(alias) is not None]
    if len(given) > 1 and tuple(given) not in _said:
        _said.add(tuple(given))
        log.warning("ggbatch.lm_eval: generation_kwargs %s all give the most tokens to generate: %s is used "
                    "(lm-eval's priority: %s)", given, given[0], " > ".join(MAX_TOKEN_ALIASES))
    return int(_number(gen_kwargs, given[0], int, name)) if given else 256


def _number(gen_kwargs: Mapping[str, Any], key: str, kind: type, name: str, default: Any = None) -> Any:
    """A gen_kwargs value as a number of `kind` (an int a whole number 0 or more); InputError
    naming the key, its value and the request when it is not."""
    value = gen_kwargs.get(key)
    if value is None:
        return default
    try:
        number = kind(value)
        if isinstance(value, bool) or (kind is int and (number < 0 or number != float(value))):
            raise ValueError(value)
    except (TypeError, ValueError):
        what = "a whole number, 0 or more" if kind is int else "a number"
        raise InputError(f"ggbatch.lm_eval: {name}: generation_kwargs {key} must be {what}, "
                         f"got {quote(value)}") from None
    return number


_said: set[Any] = set()  # gen_kwargs already said to be unused, and sets of max-token aliases said
