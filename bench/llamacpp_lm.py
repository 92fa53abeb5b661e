"""The issue's log-likelihood peer: lm-eval's model over llama-cpp-python computing each of lm-eval's
own contexts once (`logits_all` off), every one-token continuation of a context read from the
context's last logits row. The fastest honest way to score a multiple-choice task with
llama-cpp-python alone: one prompt at a time, no batching across prompts, no prefix reuse.

Used by bench/lmeval_compare.py; tokenized exactly as ggbatch.lm_eval tokenizes (lm-eval's
TemplateLM._encode_pair over the model's tokenizer, special tokens parsed, BOS added). With
`in_child`, the model lives in a process of its own and lm-eval's process only sends it token
lists: on a GPU machine, llama-cpp-python's CUDA build crashed inside lm-eval's process
(docs/performance/pools-and-weighing.md, On a GPU).
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from typing import Any, Optional

import llama_cpp
import numpy as np
from lm_eval.api.model import TemplateLM

from plain_weights import follow_plan


class OnceScorer:
    """The model in this process: tokenize, and score one-token continuations of a context from
    the log-softmax of its last row (each context decoded from an empty KV cache)."""

    def __init__(self, model: str, n_ctx: int, n_threads: Optional[int], n_gpu_layers: int) -> None:
        follow_plan()
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=512, logits_all=False,
                                   n_threads=n_threads, n_gpu_layers=n_gpu_layers, flash_attn=False, verbose=False)
        self.tokens_computed = 0

    def specials(self) -> tuple[int, int]:
        return int(self.llm.token_eos()), int(self.llm.token_bos())

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=True)

    def score(self, context: list[int], tokens: list[int]) -> list[tuple[float, bool]]:
        """(log-probability, is it the argmax) of each token as the one after `context`."""
        self.llm.reset()
        self.llm.eval(context)
        self.tokens_computed += len(context)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1),
                                       shape=(self.llm.n_vocab(),)).astype(np.float64)
        top = logits.max()
        row = logits - top - np.log(np.exp(logits - top).sum())
        best = int(np.argmax(row))
        return [(float(row[t]), t == best) for t in tokens]


def _serve(conn: Connection, args: tuple[Any, ...]) -> None:
    """A child's loop: each message names a method of its OnceScorer and the arguments."""
    scorer = OnceScorer(*args)
    conn.send(scorer.specials())
    while (message := conn.recv()) is not None:
        name, call_args = message
        conn.send((getattr(scorer, name)(*call_args), scorer.tokens_computed))


class ChildScorer:
    """OnceScorer's calls answered by one in a spawned process."""

    def __init__(self, *args: Any) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._conn, child = spawn.Pipe()
        self._process = spawn.Process(target=_serve, args=(child, args), daemon=True)
        self._process.start()
        self._specials: tuple[int, int] = self._conn.recv()
        self.tokens_computed = 0

    def specials(self) -> tuple[int, int]:
        return self._specials

    def _call(self, name: str, *args: Any) -> Any:
        self._conn.send((name, args))
        result, self.tokens_computed = self._conn.recv()
        return result

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        tokens: list[int] = self._call("tokenize", text, add_bos)
        return tokens

    def score(self, context: list[int], tokens: list[int]) -> list[tuple[float, bool]]:
        scored: list[tuple[float, bool]] = self._call("score", context, tokens)
        return scored

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(30)


class LlamaCppOnceLM(TemplateLM):  # type: ignore[misc]  # lm-eval ships no type information
    """loglikelihood only: each distinct context decoded once, its continuations (one token each)
    scored from the last row's log-softmax."""

    def __init__(self, model: str, n_ctx: int = 2048, n_threads: Optional[int] = None, n_gpu_layers: int = 0,
                 in_child: bool = False) -> None:
        super().__init__()
        args = (model, n_ctx, n_threads, n_gpu_layers)
        self.scorer: Any = ChildScorer(*args) if in_child else OnceScorer(*args)
        self._eos, self._bos = self.scorer.specials()

    @property
    def tokens_computed(self) -> int:
        return int(self.scorer.tokens_computed)

    @property
    def eot_token_id(self) -> int:
        return self._eos

    @property
    def prefix_token_id(self) -> int:
        return self._bos

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        tokens: list[int] = self.scorer.tokenize(string, add_special_tokens is not False)
        return tokens

    def tok_decode(self, tokens: list[int]) -> str:
        raise NotImplementedError("the peer scores multiple choice only")

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, (_, ctx, cont) in enumerate(requests):
            if len(cont) != 1:
                raise ValueError("this peer scores one-token continuations only (as MMLU's letters are)")
            by_context.setdefault(tuple(ctx), []).append(i)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for ctx, members in by_context.items():
            for i, got in zip(members, self.scorer.score(list(ctx), [requests[i][2][0] for i in members])):
                out[i] = got
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError("the peer scores multiple choice only")

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("the peer scores multiple choice only")

    def close(self) -> None:
        if isinstance(self.scorer, ChildScorer):
            self.scorer.close()
