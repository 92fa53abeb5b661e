"""Everything that crosses the process boundary between the coordinator and a worker.

One small frozen dataclass per message, so a reader sees the whole conversation here:

    coordinator                         worker
        │ ── start(WorkerSpec) ──────────▶ │  pins itself, loads the model
        │ ── Configure(EngineConfig) ────▶ │  builds its context and engine
        │ ◀───────────────────── Ready ─── │
        │ ◀─────────────────── WantWork ── │  its engine is running low
        │ ── Chunk(questions) ───────────▶ │
        │ ◀───────────── AnswerBatch ───── │  every step that finished a question
        │ ◀─────────────── EngineStats ─── │  at most every 0.5 s while it works, and when it runs dry
        │ ── SetThreads(n) ──────────────▶ │  other processes take its cores (runner/watch/thread_controller.py):
        │ ◀──────────────── ThreadsSet ─── │  llama.cpp's thread count from the next step, as it says
        │ ── Configure(EngineConfig) ────▶ │  once it holds nothing, when the pool grows (runner/plan/growth.py):
        │ ◀───────────────────── Ready ─── │  builds the new engine in place, on the weights it loaded
        │ ── Stop ───────────────────────▶ │  finish what is decoding, drop the rest, exit
        │ ◀──────────────── WorkerError ── │  only when the worker itself cannot go on

Questions travel as token ids: the coordinator tokenizes once (it needs the counts to size the
context and order the work), so a worker never renders or tokenizes a prompt.

The coordinator's two helper processes, the tokenizer and the GPU probe, have their messages in
workers/helper_messages.py.

Messages cross the queues as bytes from the standard pickle (`encode`/`decode`): multiprocess
pickles queue items with dill, which costs 28-30 µs per question or answer against 2 µs for
pickle; with the message already bytes, dill's share is a copy.
"""

from __future__ import annotations

import enum
import pickle
from array import array
from dataclasses import dataclass, field
from typing import Any, Optional

from .engine.invariant import kv_streams


class FinishReason(str, enum.Enum):
    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens reached
    ERROR = "error"  # the question could not be answered; see Answer.error


@dataclass(frozen=True, slots=True)  # slots: a million of them live in the coordinator
class Question:
    """One prompt to answer. `tokens` is the full rendered prompt (shared prefix included)."""

    qid: str
    tokens: array[int]  # array('i'): compact to pickle, cheap to slice
    seed: int  # per-question sampling seed, so an answer never depends on worker or slot
    # Its own generation settings (an OpenAI Batch line's max_tokens, temperature, stop, ...);
    # None: the job's (EngineConfig.generation), as for most questions.
    generation: Optional[GenerationParams] = None
    # Questions of one group share a prefix worth computing once (runner/questions/prefix_groups.py): the
    # coordinator keeps them in one chunk where it can. 0: in no group.
    group: int = 0
    # Log-likelihood scoring: nothing is generated; each continuation's tokens are scored as they
    # follow `tokens` (workers/engine/loglik.py), and the answer carries their Scored.
    continuations: tuple[array[int], ...] = ()


@dataclass(frozen=True)
class Scored:
    """A continuation's log-likelihood given its context: the model's own log-softmax over the
    whole vocabulary (no temperature, top-k or grammar), as lm-eval's (logprob, is_greedy)."""

    logprob: float  # the sum of token_logprobs
    token_logprobs: tuple[float, ...]
    is_greedy: bool  # every continuation token is its position's argmax


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability: the model's own log-softmax over the whole vocabulary
    of the raw logits at its position (before temperature, top-k/top-p, penalties, logit_bias and a
    grammar's mask, as OpenAI and llama-server report), and the most likely tokens there."""

    token: int
    piece: bytes  # its text as the vocabulary spells it (part of a character, for some tokens)
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()  # (token, piece, logprob), most likely first


@dataclass(frozen=True)
class Sample:
    """One of a question's answers when it asks for several (SamplingParams.n)."""

    text: str
    finish_reason: FinishReason
    completion_tokens: int
    token_logprobs: Optional[tuple[TokenLogprob, ...]] = None
    in_thinking: bool = False  # as Answer.in_thinking
    # why this sample has no answer (cut before its choice or grammar was complete): the others
    # still answer the question (workers/engine/samples.py)
    error: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Answer:
    qid: str
    text: str
    finish_reason: FinishReason
    prompt_tokens: int = 0
    completion_tokens: int = 0
    worker_id: int = -1  # -1: refused before any worker had it
    ttft_s: float = 0.0  # admission to first generated token
    latency_s: float = 0.0  # admission to finish
    error: Optional[str] = None
    created: float = 0.0  # Unix time it finished (0: unknown); an OpenAI Batch line's "created"
    # Fixed choices answered from the logits, when asked (AnswerSpec.logprobs): each choice's
    # log-probability (log-softmax over the whole vocabulary, its best token variant)
    choice_logprobs: Optional[dict[str, float]] = None
    # Its prompt went through the model. False: failed before (too long for the context, a
    # grammar that could not be built) or with the worker that died on it; its prompt_tokens
    # are then no work done, and the report counts them apart.
    prompt_decoded: bool = True
    # Each generated token's log-probability, when asked (GenerationParams.token_logprobs)
    token_logprobs: Optional[tuple[TokenLogprob, ...]] = None
    # Every sample of a question that asks for several (SamplingParams.n), in sample order; then
    # text, finish_reason and token_logprobs are the first sample's, completion_tokens all of theirs.
    samples: Optional[tuple[Sample, ...]] = None
    # A question's continuations (Question.continuations) scored, in their order
    scored: Optional[tuple[Scored, ...]] = None
    # Fixed choices scored as continuations: the one of the highest log-likelihood per character
    # (lm-eval's acc_norm pick; `text` is its acc pick)
    answer_norm: Optional[str] = None
    # A reasoning model's output that ended inside its thinking block (max_tokens ran out before
    # the block closed): all of `text` is thinking, there is no answer. Only the worker knows it
    # (its ThinkState follows the block): a block the chat template opened leaves no mark in the text.
    in_thinking: bool = False


@dataclass(frozen=True)
class SamplingParams:
    """llama.cpp sampler-chain settings. temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    # OpenAI's: subtracted from a token's logit once it is in the answer (presence), and once per
    # time it is (frequency), over the whole answer so far, as vLLM and OpenAI count them
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    # Answers per question, all from one computation of its prompt; sample i is drawn with seed
    # workers/engine/samples.py sample_seed(question seed, i).
    n: int = 1


# A response format is enforced by a grammar (AnswerSpec.grammar, made by the coordinator from
# the schema). Journaled answers made before it was (when this was False) are answered again:
# runner/files/formats/own_settings.py settings_key records it.
RESPONSE_FORMAT_ENFORCED = True


@dataclass(frozen=True)
class ResponseFormat:
    """An answer's required shape, as OpenAI's `response_format` asks: any JSON object, or JSON
    valid under a schema."""

    type: str  # "json_object" or "json_schema" ("text", a line asking for free text, stays in the coordinator)
    schema: Optional[str] = None  # json_schema: the schema as canonical JSON text (sorted keys)
    name: Optional[str] = None
    strict: bool = False


@dataclass(frozen=True)
class AnswerSpec:
    """What an answer must be (the job's answer.* keys, an OpenAI line's response_format).

    choices: exactly one of these strings. When each has a variant that is one token after the
    prompt (bare or with a leading space), the worker answers from the first position's logits
    (one prefill, no decode step); otherwise, or with choice_logits False, it generates under a
    grammar alternating the choices. grammar: GBNF (root rule `root`) the answer must match,
    checked by the coordinator before any worker starts (a JSON schema arrives converted)."""

    choices: tuple[str, ...] = ()
    grammar: Optional[str] = None
    logprobs: bool = False  # choices answered from the logits: write choice_logprobs
    choice_logits: bool = True  # False: single-token choices take the grammar path too
    # Choices scored by log-likelihood as other texts than the answers they stand for: a record's
    # labels answered, each scored by its text (ARC's, whose prompt does not list them); () the choices.
    texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Thinking:
    """A reasoning model's thinking block, in its vocabulary's tokens (workers/engine/thinking.py
    follows it): `<think>`…`</think>`, or gpt-oss harmony's analysis channel before the final one."""

    start: tuple[int, ...]  # opens the block: <think>; harmony: <|channel|>analysis<|message|>
    end: tuple[int, ...]  # after these the answer begins: </think>; harmony: <|channel|>final<|message|>
    forced: tuple[int, ...]  # written for the model when the budget is spent (ends with `end`)
    budget: Optional[int] = None  # thinking tokens at most; None: only max_tokens bounds them
    # harmony: what comes before a channel header is no answer yet (the model names its channel)
    header: bool = False
    # whitespace tokens a chat template may write after opening the block (`<think>\n`)
    blank: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    sampling: SamplingParams = SamplingParams()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), by token id
    response_format: Optional[ResponseFormat] = None  # as asked; enforced through `answer`
    answer: Optional[AnswerSpec] = None  # what the answer must be: fixed choices or a grammar
    # Each generated token's log-probability and the K most likely tokens at its position (0: the
    # token's alone); None: none, and no cost (answer.token_logprobs, an OpenAI line's logprobs).
    token_logprobs: Optional[int] = None
    thinking: Optional[Thinking] = None  # the model's thinking block, and its budget


def kv_cells(slots: int, n_ctx_seq: int, n_prefix: int, unified: bool, batch_invariant: bool = False) -> int:
    """KV cells (llama.cpp n_ctx) for `slots` sequences of up to n_ctx_seq tokens sharing
    n_prefix tokens, plus the prefix sequence. Unified: one pool where the prefix is stored once.
    Not unified: llama.cpp splits n_ctx evenly into one stream per sequence (invariant.kv_streams:
    the slots, the prefix and, batch-invariant, the ballast's)."""
    if unified:
        return n_prefix + slots * max(1, n_ctx_seq - n_prefix)
    return kv_streams(slots, batch_invariant) * n_ctx_seq


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What a worker needs to build its engine, decided by the coordinator."""

    model_path: str
    n_threads: int
    slots: int  # sequences decoded together in one llama_decode
    n_ctx_seq: int  # context per sequence: longest prompt + max_tokens, capped by the model
    n_batch: int  # token budget of one step (decode tokens + prefill chunks)
    # tokens every prompt starts with; decoded once, then shared
    prefix_tokens: array[int] = field(default_factory=lambda: array("i"))
    generation: GenerationParams = GenerationParams()
    # One KV pool shared by all slots (a shared prefix is stored once), or one stream per slot
    # (attention scans only the sequence's own cells). See workers/llama/engine.py.
    kv_unified: bool = True
    # Flash attention's online softmax depends on how many KV cells it scans (batch_invariant
    # turns it off).
    flash_attn: bool = True
    # KV cells of the whole context; 0 = room for every slot at full length (kv_cells above). A
    # smaller pool works too: the engine shrinks batches and preempts when it is full.
    kv_cells: int = 0
    # Weights copied into llama.cpp's CPU_REPACK layout at load (see WorkerSpec.repack). Off unless
    # the plan turns it on (runner/plan/layout.py: never on a hybrid model, whose sequences the
    # repacked kernels mix, nor on a CPU that refuses them).
    repack: bool = False
    # Answers bit-identical whatever else is in the batch, a batch of one included: every batch
    # laid out as workers/engine/invariant.py says. Needs kv_unified, flash_attn and repack all off.
    batch_invariant: bool = False
    # Prompts start from the longest prefix the worker's KV streams hold, and slots keep a finished
    # prompt's cells for the next question that shares them (workers/engine/prefix_cache.py). Needs one
    # stream per sequence; off: from the shared prefix only.
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        if self.batch_invariant and (self.kv_unified or self.flash_attn or self.repack):
            raise ValueError("batch_invariant needs kv_unified, flash_attn and repack off (got "
                             f"{self.kv_unified}, {self.flash_attn}, {self.repack})")


# worker -> coordinator


@dataclass(frozen=True)
class Started:
    """A worker process's first word, before it loads the model: it has opened its task queue, so
    the coordinator may unlink the queue's named semaphores now (runner/pool/local.py), and a
    parent ended at once meanwhile (SIGTERM's default) leaves none behind."""

    worker_id: int


@dataclass(frozen=True)
class Ready:
    worker_id: int
    pid: int
    load_s: float
    n_threads: int
    cores: tuple[int, ...]
    n_gpu_layers: int = 0  # what llama.cpp was given (a negative value: all layers)
    gpu_layers: int = 0  # layers llama.cpp says it offloaded; 0 on a build without GPU offload
    # The model's memory as llama.cpp says (workers/engine/memory_kind.py MemoryKind's value): on
    # "recurrent" and "hybrid" the engine takes other ways than on "attention" (no prefix cache).
    memory: str = "attention"


@dataclass(frozen=True)
class WantWork:
    worker_id: int
    n: int


@dataclass(frozen=True)
class AnswerBatch:
    worker_id: int
    answers: tuple[Answer, ...]
    step_stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineStats:
    """The engine's cumulative counters in this worker life: sent at most every STATS_EVERY_S
    while it works (never per step: a step can take 5 ms), and when it runs out of questions,
    just before the answers that emptied it, so the coordinator's totals are whole at the end."""

    worker_id: int
    steps: int
    busy_slots: int  # summed over steps: busy_slots / steps is the mean occupancy
    generated_tokens: int
    prompt_tokens: int  # prompt tokens decoded, the shared prefix's included (the engine's prompt_computed)


STATS_EVERY_S = 0.5


@dataclass(frozen=True)
class ThreadsSet:
    """The answer to SetThreads: the thread count llama.cpp reports now (llama_n_threads), and
    before. Equal when the engine cannot change it (no llama.cpp context: tests' fake engine).
    steps: the engine steps run before the change (0: its first step runs the new count)."""

    worker_id: int
    before: int
    n_threads: int
    steps: int = 0


@dataclass(frozen=True)
class WorkerError:
    worker_id: int
    stage: str  # "load" (pin, load the model), "configure" (build the engine) or "run"
    kind: str  # the exception's class name, for the log
    message: str
    traceback: str
    model_load: bool = False  # a ModelLoadError (workers/llama/load_errors.py): every worker would fail so


# coordinator -> worker


@dataclass(frozen=True)
class Configure:
    """The engine to build: sent once the coordinator has tokenized and planned, and again, to a
    worker that holds nothing, when the pool grows (the worker builds it in place)."""

    engine: EngineConfig


@dataclass(frozen=True)
class Chunk:
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class SetThreads:
    """Run llama.cpp with n threads (prompt and generation) from the next step on."""

    n: int


@dataclass(frozen=True)
class Stop:
    """Finish the questions already decoding, drop the ones not started, then exit."""


def encode(msg: Any) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return pickle.loads(data)
