"""The issue's log-likelihood peer: lm-eval's model over llama-cpp-python computing each of lm-eval's
own contexts once (`logits_all` off), every one-token continuation of a context read from the
context's last logits row. The fastest honest way to score a multiple-choice task with
llama-cpp-python alone: one prompt at a time, no batching across prompts, no prefix reuse.

Used by bench/lmeval_compare.py; tokenized exactly as ggbatch.lm_eval tokenizes (lm-eval's
TemplateLM._encode_pair over the model's tokenizer, special tokens parsed, BOS added).
"""

from __future__ import annotations

from typing import Any, Optional

import llama_cpp
import numpy as np
from lm_eval.api.model import TemplateLM


class LlamaCppOnceLM(TemplateLM):
    """loglikelihood only: each distinct context decoded once, its continuations (one token each)
    scored from the last row's log-softmax."""

    def __init__(self, model: str, n_ctx: int = 2048, n_threads: Optional[int] = None, n_gpu_layers: int = 0) -> None:
        super().__init__()
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=512, logits_all=False,
                                   n_threads=n_threads, n_gpu_layers=n_gpu_layers, flash_attn=False, verbose=False)
        self.tokens_computed = 0

    @property
    def eot_token_id(self) -> int:
        return int(self.llm.token_eos())

    @property
    def prefix_token_id(self) -> int:
        return int(self.llm.token_bos())

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        return self.llm.tokenize(string.encode(), add_bos=add_special_tokens is not False, special=True)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.llm.detokenize(tokens).decode(errors="replace")

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, (_, ctx, cont) in enumerate(requests):
            if len(cont) != 1:
                raise ValueError("this peer scores one-token continuations only (as MMLU's letters are)")
            by_context.setdefault(tuple(ctx), []).append(i)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for ctx, members in by_context.items():
            row = self._last_row(list(ctx))
            for i in members:
                token = requests[i][2][0]
                out[i] = (float(row[token]), bool(token == int(np.argmax(row))))
        return out

    def _last_row(self, tokens: list[int]) -> np.ndarray:
        """The log-softmax of the logits after `tokens`, computed from an empty context."""
        self.llm.reset()
        self.llm.eval(tokens)
        self.tokens_computed += len(tokens)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1),
                                       shape=(self.llm.n_vocab(),)).astype(np.float64)
        top = logits.max()
        return logits - top - np.log(np.exp(logits - top).sum())

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError("the peer scores multiple choice only")

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("the peer scores multiple choice only")
