"""One question's life inside the engine, and the pure stop rules applied to it."""

from __future__ import annotations

import codecs
import enum
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Optional
from typing import Sequence as Seq

from ..protocol import FinishReason, GenerationParams, Question, TokenLogprob
from .samples import SampleSet, sample_seed


class Phase(enum.Enum):
    WAITING = "waiting"  # queued, no slot yet
    PREFILL = "prefill"  # prompt tokens still going into the KV cache, maybe over several steps
    DECODE = "decode"  # one new token per step
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    question: Question
    phase: Phase = Phase.WAITING
    seq_id: int = -1  # llama.cpp sequence id (the slot) while admitted
    n_cached: int = 0  # prompt tokens already in the KV cache (shared prefix included)
    source: int = -1  # the sequence whose KV its first n_cached tokens were copied from at admission
    kv_reserved: int = 0  # KV cells this sequence may still claim (see Scheduler.admit)
    output: list[int] = field(default_factory=list)
    text_bytes: bytearray = field(default_factory=bytearray)
    sampler: Any = None  # llama.cpp sampler chain, owned by the engine
    grammar: Any = None  # llama.cpp grammar sampler (AnswerSpec), owned by the engine
    # AnswerSpec.choices answered from the logits: each choice's single-token variants
    choice_tokens: Optional[tuple[tuple[int, ...], ...]] = None
    choice_scores: Optional[list[float]] = None  # their log-probabilities, once computed
    think: Any = None  # a reasoning model's place in its thinking block (engine/thinking.py ThinkState)
    error: Optional[str] = None  # why it could not be answered
    # Each picked token's log-probability, when its settings ask (GenerationParams.token_logprobs):
    # one per token of `output` and, last, the end-of-generation token's
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # A question asking for several samples (workers/engine/samples.py): which one this sequence
    # draws, the set they finish into, and the slots held for the others until its prompt is in.
    sample: int = 0
    samples: Optional[SampleSet] = None
    fork_ids: list[int] = field(default_factory=list)
    # A scored question's other continuations (workers/engine/loglik.py), forked from this one's KV
    # into the slots it holds once `fork_at` prompt tokens are in: its context but the last token.
    forks: list["Sequence"] = field(default_factory=list)
    fork_at: int = 0
    # While it waits, its context's common prefix lengths with prompts held in KV (prefix_cache.shared_len)
    known_prefixes: dict[int, tuple[array[int], int]] = field(default_factory=dict)
    t_admit: float = 0.0
    t_first: float = 0.0
    finish: Optional[FinishReason] = None
    stop_cut: Optional[int] = None  # character index where a stop string begins
    # Where its answer begins, a character index into its text: after a reasoning model's thinking
    # block (None while it thinks); stop strings are looked for from there, never in the block or
    # the end of it ggbatch writes. 0 for a question without thinking.
    answer_from: Optional[int] = 0
    # workers/engine/loglik.py Scoring: its prompt's last tokens are scored, nothing is generated
    scoring: Any = None

    @property
    def prompt(self) -> array[int]:
        return self.question.tokens

    @property
    def thinking(self) -> bool:
        """Still inside a reasoning model's thinking block: its answer has not begun."""
        return self.think is not None and not self.think.answering

    @property
    def n_prompt(self) -> int:
        return len(self.question.tokens)

    @property
    def scored_from(self) -> int:
        """A scored sequence's first position whose logits are needed: its context's last token
        (the rows from it on score the targets, one each)."""
        assert self.scoring is not None
        return int(self.n_prompt - self.scoring.n - 1)

    @property
    def seed(self) -> int:
        """Its sampler's seed: the question's, or its sample's."""
        return sample_seed(self.question.seed, self.sample)

    @property
    def slots_wanted(self) -> int:
        """Slots it takes at admission: its own, and one for each other sample or continuation
        still to fork."""
        forking = self.samples is not None and self.sample == 0 and not self.samples.forked
        return self.samples.n if forking and self.samples is not None else 1 + len(self.forks)

    @property
    def prefill_end(self) -> int:
        """Where its prompt's next chunks stop: the fork point while continuations wait to fork
        from its KV, else the prompt's end."""
        return self.fork_at if self.forks else self.n_prompt

    def forks_now(self) -> bool:
        """It holds slots for the other samples or continuations, and its prompt is in as far as
        they fork from (prefill_end): they fork from its KV now."""
        return bool(self.fork_ids) and self.phase is Phase.PREFILL and self.n_cached >= self.prefill_end

    @property
    def context(self) -> array[int]:
        """The prompt tokens its KV may start from (workers/engine/prefix_cache.py): all of them but the
        scored ones, whose rows must be computed (a start leaves the last of these to compute too)."""
        return self.question.tokens if self.scoring is None else self.question.tokens[:self.n_prompt - self.scoring.n]

    @property
    def next_pos(self) -> int:
        """Position of the next token fed to the model."""
        return self.n_cached if self.phase is Phase.PREFILL else self.n_prompt + len(self.output) - 1

    def admit(self, seq_id: int, n_shared: int, source: int = -1) -> None:
        self.seq_id = seq_id
        self.n_cached = n_shared
        self.source = source
        self.phase = Phase.PREFILL
        self.t_admit = time.perf_counter()

    def accept(self, token: int, piece: bytes, is_eog: bool, gen: GenerationParams, n_ctx_seq: int) -> bool:
        """Record a sampled token (`piece`: its text, `is_eog`: it ends generation); True when the
        sequence is finished, with `finish` (and `stop_cut` for a stop string) set. The rules, in
        order: end of generation (not part of the answer), a stop string ending in this token,
        max_tokens, the context full."""
        if self.phase is Phase.PREFILL:
            self.phase = Phase.DECODE
            self.t_first = time.perf_counter()
        self.output.append(token)
        if is_eog and not gen.ignore_eos:
            self.output.pop()
            self.finish = FinishReason.STOP
            return True
        before = len(self.text_bytes)
        self.text_bytes += piece
        if self.answer_from is None and self.think.answering:  # this token ends the block, or begins the answer
            begins = before if self.think.skipped else len(self.text_bytes)
            self.answer_from = len(decode_text(bytes(self.text_bytes[:begins]), final=False))
        # an answer held to choices or a grammar ends where they say: a stop string would cut it
        # into one that is neither ("blu" of "blue", a JSON object without its closing brace)
        if gen.stop and self.answer_from is not None and gen.answer is None:
            cut = self._stop_in(gen.stop, len(self.text_bytes) - before)
            if cut is not None:
                self.stop_cut, self.finish = cut, FinishReason.STOP
                return True
        if len(self.output) >= gen.max_tokens or self.n_prompt + len(self.output) >= n_ctx_seq:
            self.finish = FinishReason.LENGTH
            return True
        return False

    def _stop_in(self, stops: Seq[str], new_bytes: int) -> Optional[int]:
        """Where the earliest stop string begins (a character index into the text), scanning only
        the tail that could hold one ending in the last token, and the answer alone."""
        text = decode_text(bytes(self.text_bytes), final=False)
        return find_stop(text, stops, max(self.answer_from or 0, len(text) - new_bytes - max(map(len, stops))))

    def text(self) -> str:
        """The answer so far: the generated text, cut where a stop string begins."""
        text = decode_text(bytes(self.text_bytes))
        return text[:self.stop_cut] if self.stop_cut is not None else text

    def reset_to_waiting(self) -> None:
        """Preempted (no KV room): drop its progress, it starts over when re-admitted."""
        self.phase = Phase.WAITING
        self.seq_id = -1
        self.n_cached = 0
        self.output.clear()
        self.text_bytes.clear()
        self.logprobs.clear()
        self.choice_scores = None


def common_prefix_len(a: Seq[int], b: Seq[int]) -> int:
    """Length of the longest common prefix of two token sequences. Bisection over slice
    comparisons, which run in C: the coordinator compares long prompts by the thousand."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def find_stop(text: str, stops: Seq[str], search_from: int = 0) -> Optional[int]:
    """Index of the earliest stop string in text[search_from:] (as an index into text), or None.
    Callers pass search_from = len(previous text) - longest stop + 1 so each step scans only the tail."""
    best: Optional[int] = None
    start = max(0, search_from)
    for stop in stops:
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best):
            best = i
    return best


def decode_text(raw: bytes, final: bool = True) -> str:
    """Generated bytes as text, bad bytes replaced (U+FFFD). final=False: a character whose bytes
    have not all come yet is left out, so that the text of a prefix is a prefix of the whole's
    text and an index into it (a stop string's) is one into the whole's."""
    if final:
        return raw.decode("utf-8", errors="replace")
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(raw, final=False)
