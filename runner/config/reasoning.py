"""A reasoning model's thinking block as its vocabulary spells it, and the budgets that bound it.

The model thinks in `<think>`…`</think>` when its vocabulary holds each of them as one token
(Qwen3, QwQ, DeepSeek-R1 and its distills); in gpt-oss's harmony format when it holds the
channel tokens (`<|channel|>`, `<|message|>`, `<|start|>`, `<|end|>`): the analysis channel is the
thinking, the final channel the answer. The token ids go to the workers in GenerationParams.thinking
(workers/engine/thinking.py follows the block).

A budget (`reasoning.max_tokens`, `--thinking-budget`, an OpenAI line's `reasoning_effort`) on a
model with neither is refused with one line: there is no thinking to bound.

Choices scored by log-likelihood generate nothing, so no thinking comes before them: each is
scored as the answer after an empty block, the one a budget of 0 writes (scoring_context).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from ...workers.protocol import GenerationParams, Thinking

THINK = ("<think>", "</think>")
HARMONY = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>")
HARMONY_START = "<|channel|>analysis<|message|>"
HARMONY_END = "<|channel|>final<|message|>"
HARMONY_FORCED = "<|end|><|start|>assistant<|channel|>final<|message|>"
HARMONY_ASSISTANT = "<|start|>assistant"  # where harmony's generation prompt ends: the model names its channel
BLANKS = ("\n", "\n\n", " ", "\n\n\n")  # what templates write after opening the block

# OpenAI's reasoning_effort -> thinking tokens at most. max_tokens still bounds the whole answer,
# so a high effort needs a max_tokens above its budget to leave room for the answer.
EFFORT_BUDGETS = {"none": 0, "minimal": 128, "low": 512, "medium": 2048, "high": 8192}


def model_thinking(tokenizer: Any) -> Optional[Thinking]:
    """The model's thinking block (no budget yet), or None when its vocabulary has none.
    `tokenizer`: the job's tokenizer process (runner/questions/tokenizing.py)."""
    texts = THINK + HARMONY + (HARMONY_START, HARMONY_END, HARMONY_FORCED) + BLANKS
    tokenizer.submit(texts, [False] * len(texts))
    got = tokenizer.receive()
    spelled, start = [], 0
    for count in got.counts:
        spelled.append(tuple(got.tokens[start:start + max(count, 0)]))
        start += max(count, 0)
    one = [len(tokens) == 1 for tokens in spelled]
    blank = tuple(sorted({t for tokens in spelled[9:] for t in tokens}))
    if all(one[:2]):
        return Thinking(spelled[0], spelled[1], spelled[1], blank=blank)
    if all(one[2:6]):
        return Thinking(spelled[6], spelled[7], spelled[8], header=True, blank=blank)
    return None


def with_budget(thinking: Optional[Thinking], budget: Optional[int], where: str) -> Optional[Thinking]:
    """The block with this budget; ValueError naming `where` when the model has no block."""
    if budget is None:
        return thinking
    if thinking is None:
        raise ValueError(f"{where}: {budget}: the model's vocabulary has no thinking block (<think> and </think>, "
                         "or gpt-oss's harmony channels), so there is no thinking to bound")
    return replace(thinking, budget=budget)


def with_effort(own: Optional[GenerationParams], job: GenerationParams,
                effort: Optional[str]) -> Optional[GenerationParams]:
    """A question's own settings (None: the job's) with its line's reasoning_effort as the budget
    (checked already: effort_problem); None when they come out as the job's."""
    gen = own or job
    if effort is None or gen.thinking is None:
        return own
    gen = replace(gen, thinking=replace(gen.thinking, budget=EFFORT_BUDGETS[effort]))
    return None if gen == job else gen


def effort_problem(effort: Optional[str], job: GenerationParams, scored: bool = False,
                   field: str = "body.reasoning_effort") -> Optional[str]:
    """Why a line's reasoning_effort cannot apply to this model, as OpenAI refuses it on a model
    that does not reason; or to choices scored by log-likelihood (`scored`), which no thinking
    comes before. `field`: the line's name for it (a /v1/responses line's body.reasoning.effort)."""
    if effort is None:
        return None
    if job.thinking is None:
        return (f"{field}: {effort!r}: the model's vocabulary has no thinking block (<think> and "
                "</think>, or gpt-oss's harmony channels), so there is no reasoning to set")
    if scored and EFFORT_BUDGETS[effort]:
        return (f"{field}: {effort!r}: the choices are scored by log-likelihood after an empty "
                "thinking block (nothing is generated), so only 'none' applies")
    return None


def scoring_problem(thinking: Optional[Thinking]) -> Optional[str]:
    """Why choices cannot be scored by log-likelihood under this thinking budget: a budget above 0
    asks for thinking that scoring never generates."""
    if thinking is None or not thinking.budget:
        return None
    return (f"reasoning.max_tokens: {thinking.budget} with answer.choice_scoring: loglikelihood: each choice is "
            "scored as the answer after an empty thinking block, and no thinking is generated; leave the budget "
            "out (or 0), or let the model think first with answer.choice_scoring: first_token")


def scoring_context(prompt: str, thinking: Optional[Thinking]) -> str:
    """The prompt a choice scored by log-likelihood continues. A prompt that opens the model's
    thinking block (`<think>\n`, harmony's analysis channel) gets the block's end, as a budget
    of 0 writes it, and a harmony prompt waiting for its channel gets the final channel's header:
    the choice is then scored as the answer, not as the first words of the thinking. Any other
    prompt is scored as it is (the model answering without thinking; a template asked for no
    thinking, as Qwen3's enable_thinking: false, has closed the block itself)."""
    if thinking is None:
        return prompt
    body = prompt.rstrip()
    if not thinking.header:
        return prompt + THINK[1] if body.endswith(THINK[0]) else prompt
    if body.endswith(HARMONY_START):
        return prompt + HARMONY_FORCED
    return prompt + HARMONY_END if body.endswith(HARMONY_ASSISTANT) else prompt


def block_opened(prompt: str, thinking: Thinking) -> bool:
    """Whether the prompt opened the thinking block already (or, harmony, went to the final
    channel), so that the model writes no opening of its own before the budget counts."""
    body = prompt.rstrip()
    if not thinking.header:
        return body.endswith(THINK[0])
    return body.endswith(HARMONY_START) or body.endswith(HARMONY_END)


def thinking_room(thinking: Optional[Thinking], max_tokens: int) -> int:
    """The tokens a thinking block may take before the answer: its budget and the forced end, or
    all of max_tokens when it has no budget; 0 for a model that does not think."""
    if thinking is None:
        return 0
    if thinking.budget is None:
        return max_tokens
    return min(max_tokens, len(thinking.start) + thinking.budget + len(thinking.forced))


def answer_room_problem(thinking: Optional[Thinking], max_tokens: int,
                        names: tuple[str, str] = ("max_tokens", "reasoning.max_tokens"),
                        opened: bool = True) -> Optional[str]:
    """Why no answer held to choices or a grammar can come out under this max_tokens: a budget
    spent whole and the end written for it leave no token for the answer; None when they leave
    one (or there is no budget: the model may end its thinking early, and an answer cut short
    fails on its own). One token is what any answer needs at least: a choice's own count as
    the tokenizer spells it alone may be more than the grammar lets the model write it in (a
    SentencePiece vocabulary spells "A" alone as a space and "A"). `names`: what the message calls
    max_tokens and the budget (an OpenAI line's body.max_tokens and body.reasoning_effort).
    `opened`: the prompt opened the block (block_opened); else the model writes its opening
    first (gpt-oss: `<|channel|>analysis<|message|>`), before the budget counts."""
    if thinking is None or thinking.budget is None:
        return None
    opening, forced = 0 if opened else len(thinking.start), len(thinking.forced)
    need = opening + thinking.budget + forced + 1
    if max_tokens >= need:
        return None
    tokens, budget = names
    lower = f" or lower {budget}" if thinking.budget else ""  # a budget of 0 is as low as it goes
    written = f"the opening of the thinking the model writes ({_tokens(opening)}) + " if opening else ""
    return (f"{tokens}: {max_tokens}: leaves no token for the answer after the thinking: {written}{budget} "
            f"({thinking.budget}) + the end of the thinking written for it ({_tokens(forced)}) "
            f"+ one token of the answer need {need}; raise {tokens}{lower}")


def _tokens(n: int) -> str:
    return f"{n} token{'s' if n != 1 else ''}"
