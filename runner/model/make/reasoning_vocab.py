"""The demo vocabulary of a reasoning model (`ggbatch make-model --reasoning think|harmony`): the
tokens a reasoning model thinks between, and a chat template that opens its thinking block.

    think     <think> and </think> as one token each (user-defined, as in Qwen3's GGUFs); the
              template opens `<think>` after the assistant's turn, as Qwen3-Thinking's and
              DeepSeek-R1's do
    harmony   gpt-oss's <|start|> <|end|> <|message|> <|channel|> <|return|> <|call|>; the template
              opens the analysis channel, which gpt-oss's own leaves to the model

A random-weight model never writes a special token (their output rows are zero: gguf_random.py),
so without the template's opening it would never think; with it, it thinks until its budget is
spent and the end of the block is written for it (workers/engine/thinking.py).
"""

from __future__ import annotations

from dataclasses import replace

import gguf

from .gguf_vocab import GGUFVocab

REASONING = ("think", "harmony")

_THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
_HARMONY_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant<|channel|>analysis<|message|>' }}{% endif %}"
)
# (token, type): llama.cpp treats <|end|> as the end of a message, not of generation, when
# <|return|> and <|call|> are there too (its gpt-oss rule).
_TOKENS = {
    "think": [("<think>", gguf.TokenType.USER_DEFINED), ("</think>", gguf.TokenType.USER_DEFINED)],
    "harmony": [(t, gguf.TokenType.CONTROL) for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                                      "<|return|>", "<|call|>")],
}


def with_reasoning(vocab: GGUFVocab, kind: str) -> GGUFVocab:
    """The vocabulary with a reasoning model's tokens added and its chat template."""
    if kind not in REASONING:
        raise ValueError(f"unknown reasoning format {kind!r}; known: {', '.join(REASONING)}")
    added = _TOKENS[kind]
    return replace(vocab, tokens=vocab.tokens + [t for t, _ in added],
                   token_types=vocab.token_types + [int(k) for _, k in added],
                   scores=None if vocab.scores is None else vocab.scores + [0.0] * len(added),
                   chat_template=_THINK_TEMPLATE if kind == "think" else _HARMONY_TEMPLATE)
