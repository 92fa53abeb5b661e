"""ggbatch as lm-evaluation-harness's model: `GgbatchLM`, registered as `ggbatch`.

    ggbatch eval --model M.gguf --tasks T
    lm_eval.simple_evaluate(model=ggbatch.lm_eval.GgbatchLM(model="M.gguf"), tasks=[...])

One ggbatch.Pool (runner/warm/pool.py) holds the workers and the model for the object's lifetime,
so the model loads once for every task (it starts loading when the object is made, while lm-eval
builds its tasks: Pool.starting); each lm-eval call sends its whole request list to it at once:
the workers' batches, the dispatch of prompts that share a prefix together, and the prefix cache,
so an MMLU context is computed once for its four continuations and a few-shot prefix once per worker.

    loglikelihood: lm-eval's tokenization (TemplateLM._encode_pair: context and continuation
        encoded together, split at the context's length: runner/questions/continuations.py), a
        context's continuations one question
        (workers/engine/loglik.py), each (sum of log-probabilities, is_greedy)
        A request longer than max_length is cut from the left as lm-eval's Hugging Face model
        cuts it: (context + continuation)[-(max_length + 1):], of which max_length tokens go
        through the model (a continuation's last token is never fed).
    loglikelihood_rolling: lm-eval's rolling windows of the text, each window's tokens scored
        (max_length + 1 tokens a window, max_length of them fed: they fit the model's context)
    generate_until: each context greedy or sampled as its gen_kwargs say, up to max_gen_toks
        tokens, cut at the first `until` string, not stripped (as lm-eval's other models return it);
        a context keeps its last max_length - max_gen_toks tokens (lm-eval's vLLM and Hugging Face
        models' rule). A request that still cannot be answered ends the run with one line naming
        it (task and doc): never a silent empty answer.
    apply_chat_template (lm-eval's --apply_chat_template): the pool's chat template, the model's
        own unless the settings give one, as a job's prompts are written

speed_up_lm_eval(): lm-eval's own slow parts made faster in this process, the texts and tasks the
same: its index of its own tasks kept between runs (runner/tools/lm_eval_task_index.py), its prompt
templates compiled once each (runner/tools/lm_eval_templates.py). `ggbatch eval` calls it.

Scores are the model's own log-softmax, with llama.cpp's flash attention off (its CPU kernel rounds
K and V to F16, which moves a log-likelihood by up to about 0.01 nats a token).
"""

from __future__ import annotations

import logging
import queue
from array import array
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional, Union

from tqdm import tqdm

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
except ImportError as exc:  # lm-eval is the optional extra ggbatch[eval]
    raise ImportError("ggbatch.lm_eval needs lm-eval: pip install 'ggbatch[eval]'") from exc

from ggbatch.runner.errors import ConfigError, InputError
from ggbatch.runner.questions.continuations import pair_texts, split_pair
from ggbatch.runner.questions.prompts import PLAIN_TEMPLATE
from ggbatch.runner.tools.lm_eval_requests import (
    chat_only,
    chat_only_unused,
    check_model_args,
    checked_max_length,
    device_settings,
    generation_of,
    generation_window,
    request_identity,
    request_names,
    request_seeds,
    say_cut,
    say_shrunk,
    scored_window,
    setting,
    unanswered,
    within_context,
)
from ggbatch.runner.tools.lm_eval_task_index import cache_task_index
from ggbatch.runner.tools.lm_eval_templates import compile_templates_once
from ggbatch.runner.warm.calls import Answered
from ggbatch.runner.warm.overrides import SOURCE
from ggbatch.runner.warm.pool import Pool
from ggbatch.runner.warm.pool_errors import Untokenizable
from ggbatch.workers.protocol import Question

log = logging.getLogger("ggbatch")

__all__ = ["GgbatchLM", "speed_up_lm_eval"]

DEFAULT_MAX_LENGTH = 2048  # tokens of a rolling window when the model does not say its context


def speed_up_lm_eval() -> list[str]:
    """lm-eval's own slow parts made faster in this process (its task index kept in ggbatch's cache
    folder between runs, its prompt templates compiled once each); which were, by name. None where
    lm-eval is not a version they know: it is left as it is."""
    done = {"task index kept": cache_task_index(), "templates compiled once": compile_templates_once()}
    return [what for what, made in done.items() if made]


def as_model_args(exc: ConfigError) -> ConfigError:
    """A setting's error named as lm-eval's model_args, which the user gave, not as ggbatch.Pool(),
    which they never called."""
    return ConfigError(str(exc).replace(f"{SOURCE}: ", "ggbatch.lm_eval model_args: ", 1))


@register_model("ggbatch")
class GgbatchLM(TemplateLM):  # type: ignore[misc]  # lm-eval ships no type information
    """lm-eval's model over one ggbatch.Pool. `model`: a GGUF path (or a Hugging Face name, as
    ggbatch takes it); other keyword arguments are ggbatch's job keys (workers, threads, slots, ...)."""

    def __init__(self, model: Optional[str] = None, max_length: Optional[int] = None, batch_size: Any = None,
                 max_batch_size: Any = None, device: Any = None, pretrained: Optional[str] = None,
                 **settings: Any) -> None:
        super().__init__()
        # pretrained: the name lm-eval's Hugging Face and vLLM models take the model by
        path = model or pretrained
        if not path or (model and pretrained and model != pretrained):
            raise ConfigError("ggbatch.lm_eval: give the GGUF model once: model=PATH (or pretrained=PATH)")
        check_model_args(settings)
        # refused at the first request unless lm-eval wrote the requests with the chat template
        self._chat_only, self._chatted = chat_only(settings), False
        n_ctx = setting(settings, "model", "n_ctx")
        self._n_ctx = n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) else None
        self._max_length = checked_max_length(max_length, path, self._n_ctx)
        self._seed = setting(settings, "sampling", "seed") or 0
        settings = {**device_settings(device, settings), **settings}
        settings.setdefault("flash_attn", False)
        # The model loads while lm-eval builds its tasks (its datasets, the few-shot contexts):
        # the first call that needs the pool waits for it. A typo in the settings or a missing
        # model file is refused here, named as lm-eval's model_args.
        try:
            # Small at first (runner/warm/facts.py): log-likelihood tasks never grow it and start
            # sooner; a generate_until call grows it once, for the width its decode steps gain from.
            # per_question: each request brings its own max_gen_toks, so the pool's max_tokens is never used
            self._starting = Pool.starting(model=path, per_question=True, **settings)
        except ConfigError as exc:
            raise as_model_args(exc) from None
        self._model = path

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any],
                            additional_config: Optional[dict[str, Any]] = None) -> "GgbatchLM":
        """lm-eval's way in: model_args beside its own --batch_size, --max_batch_size and --device,
        which it passes as well (whether given or not); a key model_args gives too is model_args'
        (TemplateLM's merge raised TypeError 'got multiple values' there)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str,
                               additional_config: Optional[dict[str, Any]] = None) -> "GgbatchLM":
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @property
    def pool(self) -> Pool:
        """The started pool (waited for); why it could not start, raised (a setting found wrong
        only as the pool starts, such as a chat template, named as model_args too)."""
        try:
            return self._starting.result()
        except ConfigError as exc:
            raise as_model_args(exc) from None

    @cached_property
    def max_length(self) -> int:
        """Tokens a request feeds the model at most (its last ones): as given, else the model's
        training context up to DEFAULT_MAX_LENGTH (and the settings' model.n_ctx); more than the
        model's context is refused (a Hub model's is known once it is loaded)."""
        n_ctx_train = self.pool.n_ctx_train
        if self._max_length is None:
            return min(n_ctx_train or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH, self._n_ctx or DEFAULT_MAX_LENGTH)
        return within_context(self._max_length, n_ctx_train, self._model)

    # -- TemplateLM's tokenizer ------------------------------------------------------------------

    @cached_property
    def _specials(self) -> tuple[int, int]:
        """(BOS, EOS) token ids; the one the model lacks stands in for the other."""
        bos, eos = self.pool.special_texts
        specials = self.pool.tokenize([bos or eos, eos or bos], add_bos=False)
        first, second = (int(t[0]) if len(t) else 0 for t in specials)
        return first, second

    @property
    def eot_token_id(self) -> int:
        return self._specials[1]

    @property
    def prefix_token_id(self) -> int:
        return self._specials[0]

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        return list(self.pool.tokenize([string], add_bos=add_special_tokens is not False)[0])

    def tok_decode(self, tokens: list[int]) -> str:
        raise NotImplementedError("ggbatch.lm_eval answers with text; it never decodes tokens")

    # -- lm-eval's --apply_chat_template -----------------------------------------------------------

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's chat template writes it (or the template the settings
        give: prompt.chat_template=...; ggbatch's plain one for a model without)."""
        self._chatted = True
        return self.pool.chat_prompt(chat_history, add_generation_prompt)

    def _check_chat_only(self) -> None:
        """A request call (lm-eval has written its requests by then): the chat-only settings
        given refused where no request was written with the chat template."""
        if self._chat_only and not self._chatted:
            raise chat_only_unused(self._chat_only)

    def chat_template(self, chat_template: Union[bool, str] = False) -> Optional[str]:
        """The template apply_chat_template renders with (lm-eval records it); None when lm-eval
        applies none."""
        return (self.pool.chat_template or PLAIN_TEMPLATE) if chat_template else None

    @property
    def tokenizer_name(self) -> str:
        """What lm-eval's request cache is keyed by: the model file, and what apply_chat_template
        writes with (the template, the system prompt, the template's arguments)."""
        return f"ggbatch:{Path(self._model).name}:{self.pool.prompt_fingerprint}"

    # -- the three request types -----------------------------------------------------------------

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """TemplateLM.loglikelihood with every distinct text tokenized once, in one pass through the
        pool (a multiple-choice question's continuations share their context)."""
        self._check_chat_only()
        pairs, names = [req.args for req in requests], request_names(requests)
        # text -> (its place among the texts tokenized with BOS, the first request it is of)
        with_bos: dict[str, tuple[int, str]] = {}
        bare: dict[str, tuple[int, str]] = {}  # an empty context's continuation: among those without
        plans: list[tuple[int, int]] = []  # (whole, context) in with_bos; (-1, continuation) in bare
        for (context, continuation), name in zip(pairs, names):
            if context == "":
                plans.append((-1, bare.setdefault(continuation, (len(bare), name))[0]))
                continue
            context, whole = pair_texts(context, continuation)
            plans.append((with_bos.setdefault(whole, (len(with_bos), name))[0],
                          with_bos.setdefault(context, (len(with_bos), name))[0]))
        encoded = self._encode_all(with_bos, bare, plans)
        return self._loglikelihood_tokens([(pair, ctx, cont) for pair, (ctx, cont) in zip(pairs, encoded)],
                                          disable_tqdm, names=names)

    def _encode_all(self, with_bos: dict[str, tuple[int, str]], bare: dict[str, tuple[int, str]],
                    plans: list[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
        """lm-eval's (context_enc, continuation_enc) for each request planned by loglikelihood."""
        whole_tokens = self._tokenize(list(with_bos), [name for _, name in with_bos.values()])
        bare_tokens = self._tokenize(list(bare), [name for _, name in bare.values()], add_bos=False) if bare else []
        out = []
        for whole, other in plans:
            if whole < 0:
                out.append(self._prefixed(list(bare_tokens[other])))
                continue
            context, cont = split_pair(list(whole_tokens[whole]), list(whole_tokens[other]))
            # A context of whitespace alone is empty once its whitespace moves to the continuation,
            # and a model without BOS (Qwen's) tokenizes that to nothing: it is the empty context
            out.append((context, cont) if context else self._prefixed(cont))
        return out

    def _prefixed(self, cont: list[int]) -> tuple[list[int], list[int]]:
        """prefix_token_id as the context, as TemplateLM gives an empty one (a continuation that
        begins with it already keeps it as the context)."""
        if cont and cont[0] == self.prefix_token_id:
            return cont[:1], cont[1:]
        return [self.prefix_token_id], cont

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, what: str = "loglikelihood",
                              names: Optional[list[str]] = None, **kwargs: Any) -> list[tuple[float, bool]]:
        """(sum of log-probabilities, is_greedy) of each (pair, context tokens, continuation tokens),
        cut to max_length fed tokens (scored_window): one question per distinct context, its
        continuations scored together; `what` names the progress bar, `names` the requests in an
        error (lm-eval's task and doc)."""
        names = names or request_names([None] * len(requests))
        windows = [scored_window(ctx, cont, self.max_length, name)
                   for (_, ctx, cont), name in zip(requests, names)]
        say_cut(what, sum(len(w[0]) < len(r[1]) for w, r in zip(windows, requests)), len(requests),
                f"(context + continuation)[-{self.max_length + 1}:]")
        contexts: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, _) in enumerate(windows):
            contexts.setdefault(tuple(ctx), []).append(i)
        questions = [Question(f"c{k}", array("i", ctx), 0,
                              continuations=tuple(array("i", windows[i][1]) for i in members))
                     for k, (ctx, members) in enumerate(contexts.items())]
        members_of = dict(zip((q.qid for q in questions), contexts.values()))

        def keep(row: Answered) -> None:  # lm-eval's cache key is a request's (context, continuation)
            for i, scored in zip(members_of[row.id], row.scored or ()):
                if requests[i][0] is not None:  # a rolling window is cached as its whole text's sum
                    self.cache_hook.add_partial(what, requests[i][0], (scored.logprob, scored.is_greedy))

        answers = self._answers(questions, [len(m) for m in contexts.values()], what, disable_tqdm, keep)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for answered, members in zip(answers, contexts.values()):
            if answered.scored is None:
                raise unanswered(what, names[members[0]], answered.error)
            for i, scored in zip(members, answered.scored):
                out[i] = (scored.logprob, scored.is_greedy)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood over lm-eval's rolling windows of max_length tokens fed."""
        self._check_chat_only()
        texts = [req.args[0] for req in requests]
        windows, owner, names = [], [], []
        requested = request_names(requests)
        for i, (tokens, name) in enumerate(zip(self._tokenize(texts, requested, add_bos=False), requested)):
            for k, window in enumerate(map(make_disjoint_window, get_rolling_token_windows(
                    token_list=list(tokens), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1))):
                windows.append((None, *window))
                owner.append(i)
                names.append(f"{name} window {k + 1}")
        totals = [0.0] * len(texts)
        scored = self._loglikelihood_tokens(windows, disable_tqdm, "loglikelihood_rolling windows", names)
        for i, (logprob, _) in zip(owner, scored):
            totals[i] += logprob
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each context's continuation, up to its max_gen_toks tokens and cut at its first `until`;
        a context longer than max_length - max_gen_toks keeps its last tokens (generation_window);
        max_gen_toks 0 is the empty text, nothing generated."""
        self._check_chat_only()
        names = request_names(requests)
        tokens = self._tokenize([req.args[0] for req in requests], names)
        seeds = request_seeds(self._seed, [(request_identity(req), req.args) for req in requests])
        questions, cut, shrunk = [], 0, 0
        for i, (req, toks) in enumerate(zip(requests, tokens)):
            generation = generation_of(req.args[1], names[i])
            if generation.max_tokens > 0:
                kept, most = generation_window(toks, generation.max_tokens, self.max_length)
                cut += len(kept) < len(toks) and most == generation.max_tokens
                shrunk += most < generation.max_tokens
                questions.append(Question(f"{i}", kept, seeds[i], replace(generation, max_tokens=most)))
        say_cut("generate_until", cut, len(requests), "the context's last max_length - max_gen_toks tokens")
        say_shrunk(shrunk, len(requests), self.max_length)
        out = [""] * len(requests)
        def keep(row: Answered) -> None:
            if row.completion is not None:
                self.cache_hook.add_partial("generate_until", requests[int(row.id)].args, row.completion)

        answers = self._answers(questions, [1] * len(questions), "generate_until", disable_tqdm,
                                keep) if questions else []
        for question, answered in zip(questions, answers):
            if answered.error is not None or answered.completion is None:
                raise unanswered("generate_until", names[int(question.qid)], answered.error)
            out[int(question.qid)] = answered.completion
        return out

    def _tokenize(self, texts: list[str], names: list[str], add_bos: bool = True) -> list[array[int]]:
        """pool.tokenize, a text its vocabulary cannot take refused naming its request (task and
        doc), as lm-eval's user knows it: not the pool's method, which they never called."""
        try:
            return self.pool.tokenize(texts, add_bos, names)
        except Untokenizable as exc:
            raise InputError(f"ggbatch.lm_eval: {exc.name}: the model's tokenizer cannot take its text: "
                             f"{exc.reason}") from None

    def _answers(self, questions: list[Question], requests: list[int], what: str, disable_tqdm: bool,
                 keep: Callable[[Answered], None]) -> list[Answered]:
        """The pool's answers, with a progress bar of lm-eval's requests (a question answers
        `requests[i]` of them) as its answers come back, each handed to `keep` then, on this
        thread: lm-eval's cache (--use_cache) holds it before the call ends, so a run stopped
        halfway keeps what it answered, and the pool's thread never waits on the cache's disk."""
        weight = {q.qid: n for q, n in zip(questions, requests)}
        heard: queue.SimpleQueue[list[Answered]] = queue.SimpleQueue()
        with tqdm(total=sum(requests), desc=f"ggbatch {what}", unit="request", disable=disable_tqdm) as bar:
            call = self.pool.submit_questions(questions, heard.put)
            while not (call.done() and heard.empty()):
                try:
                    rows = heard.get(timeout=0.1)
                except queue.Empty:
                    continue
                bar.update(sum(weight[row.id] for row in rows))
                for row in rows:
                    keep(row)
            return call.result()
