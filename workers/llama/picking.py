"""Each sequence's own way to its next token on its logits row, as its generation settings ask:
its sampler chain (none for plain greedy: the engine takes the argmax of all greedy rows at once),
its grammar, its fixed choices answered from the logits, its thinking budget, and the picked
tokens' log-probabilities. `Picker` owns the llama.cpp sampler state a sequence holds from its
admission until it finishes or is preempted; `Sampling` (workers/llama/sampling.py) does the
llama.cpp calls, workers/engine/ the pure rules.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ..engine.answers import needs_sampler
from ..engine.constraints import best_choice, choice_grammar
from ..engine.scheduler import Span
from ..engine.sequence import Sequence
from ..engine.step_counters import StepCounters
from ..engine.thinking import ThinkState
from ..protocol import AnswerSpec, GenerationParams, TokenLogprob
from .later_logprobs import LaterLogprobs
from .sampling import Logprobs, Sampling


class Picker:
    def __init__(self, sampling: Sampling, gen: GenerationParams, counters: StepCounters,
                 later: Optional[LaterLogprobs] = None) -> None:
        self.sampling = sampling
        self.later = later  # token log-probabilities worked out during the next decode, or None
        self.gen = gen  # the job's generation settings, for the questions without their own
        self.counters = counters
        # choices -> each one's single-token variants (None: some choice needs more than one token)
        self._choice_tokens: dict[tuple[str, ...], Optional[tuple[tuple[int, ...], ...]]] = {}

    def prepare(self, seq: Sequence) -> None:
        """Its sampler chain (seeded with its own seed: its sample's) and its grammar, if it needs them."""
        gen = self._gen(seq)
        if needs_sampler(gen):
            seq.sampler = self.sampling.new_sampler(gen, seq.seed)
        if gen.thinking is not None:
            seq.think, seq.answer_from = ThinkState(gen.thinking, seq.prompt), None  # the answer begins after the block
        if gen.answer is not None:
            self._constrain(seq, gen.answer)

    def free(self, seq: Sequence) -> None:
        """Its sampler chain and grammar given back (finished or preempted: a preempted sequence
        starts over, with a new grammar in its initial state)."""
        if seq.sampler is not None:
            self.sampling.free_sampler(seq.sampler)
            seq.sampler = None
        if seq.grammar is not None:
            self.sampling.free_sampler(seq.grammar)
            seq.grammar = None

    def answer_complete(self, seq: Sequence) -> bool:
        """Whether a finished sequence held to choices or a grammar got to their end: its choice
        read from the logits, or its grammar letting the answer end where it stopped. Its thinking
        not over means no answer at all."""
        if self._gen(seq).answer is None or seq.error:
            return True
        if seq.thinking:
            return False
        if seq.choice_tokens is not None:
            return seq.choice_scores is not None
        return seq.grammar is None or self.sampling.grammar_complete(seq.grammar)

    def pick_all(self, rows: list[tuple[Sequence, int]], greedy_tokens: list[int]) -> list[int]:
        """pick() of every (sequence, batch position), given the greedy argmax of the greedy rows.
        The rows that only their sampler chain decides (no grammar, choices or thinking) are
        sampled together, over the worker's cores (Sampling.sample_many)."""
        tokens = list(greedy_tokens)
        plain = [i for i, (seq, _) in enumerate(rows) if self._chain_alone(seq)]
        picked, spread = self.sampling.sample_many([(rows[i][0].sampler, rows[i][1]) for i in plain])
        for i, token in zip(plain, picked):
            tokens[i] = token
        self.counters.chains_spread += len(plain) if spread else 0
        chained = set(plain)
        for i, (seq, index) in enumerate(rows):
            if i not in chained:
                tokens[i] = self.pick(seq, index, tokens[i])
        return tokens

    @staticmethod
    def _chain_alone(seq: Sequence) -> bool:
        """Its sampler chain alone picks its token: no thinking before the answer, no fixed
        choices, no grammar."""
        return seq.sampler is not None and seq.grammar is None and seq.choice_tokens is None and not seq.thinking

    def pick(self, seq: Sequence, index: int, greedy_token: int) -> int:
        """The token of one sequence at batch position `index`, given its greedy argmax: fixed
        choices are scored; a grammar is asked only about the token picked without it, and masks
        the whole vocabulary only when it refuses that token."""
        if self._chain_alone(seq):
            return self.sampling.sample(seq.sampler, index)
        drawn: Optional[int] = None  # the chain's own draw at this position, made while opening
        if seq.thinking:
            token, answering = self._think_pick(seq, index, greedy_token)
            if not answering:
                return token
            drawn = token if seq.sampler is not None else None
        if seq.choice_tokens is not None:
            seq.choice_scores = self.sampling.choice_scores(index, seq.choice_tokens)
            seq.t_first = time.perf_counter()
            self.counters.choice_answers += 1
            return self.sampling.likeliest(index, seq.choice_tokens[best_choice(seq.choice_scores)])
        if seq.grammar is None:  # greedy, or sampled once thinking has handed over to the answer
            return greedy_token if seq.sampler is None else self._chain_pick(seq.sampler, index, drawn)
        if seq.sampler is None:
            token, again = self.sampling.constrain_greedy(seq.grammar, index, greedy_token)
        else:
            token, again = self.sampling.sample_constrained(seq.sampler, seq.grammar, index, drawn)
        self.counters.grammar_tokens += 1
        self.counters.grammar_resamples += again
        return token

    def _chain_pick(self, sampler: Any, index: int, drawn: Optional[int]) -> int:
        """The chain's token: the one it already drew at this position (peek() then accept() is
        sample(): drawing again would move its random generator and could pick `<think>`, a block
        then never followed), or a new draw."""
        if drawn is None:
            return self.sampling.sample(sampler, index)
        self.sampling.accept(sampler, drawn)
        return drawn

    def record_logprobs(self, rows: list[tuple[Span, int, int]], tokens: list[int], n_outputs: int,
                        ending: set[int]) -> None:
        """The picked token's log-probability (and the K most likely) for every sequence whose
        settings ask, all rows in one pass; nothing at all when none asks. `rows`: (span, batch
        position, logits row) of the decode's n_outputs rows; `ending`: the ids of the sequences
        that finish at this step. With `later`, those of the others are worked out during the next
        decode (workers/llama/later_logprobs.py), and added to them by join_logprobs()."""
        asking = [(span.seq, row, token, k) for (span, _, row), token in zip(rows, tokens)
                  if token >= 0 and (k := self._gen(span.seq).token_logprobs) is not None]
        if not asking:
            return
        now = [a for a in asking if id(a[0]) in ending] if self.later is not None else asking
        later = [a for a in asking if id(a[0]) not in ending] if self.later is not None else []
        if now:
            t0 = time.perf_counter()
            got = self.sampling.token_logprobs([a[1] for a in now], [a[2] for a in now], max(a[3] for a in now),
                                               n_outputs)
            self._add_logprobs(now, got, time.perf_counter() - t0)
        if later and self.later is not None:
            self.later.start([a[1] for a in later], [a[2] for a in later], max(a[3] for a in later), n_outputs,
                             lambda got, seconds: self._add_logprobs(later, got, seconds, later=True))

    def close(self) -> None:
        """The log-probabilities' own thread stopped (the engine closes: what it works on is not needed)."""
        if self.later is not None:
            self.later.close()

    def join_logprobs(self) -> None:
        """The entries worked out since the last decode began, added to their sequences."""
        if self.later is not None and self.later.pending:
            t0 = time.perf_counter()
            self.later.join()
            self.counters.logprob_wait_s += time.perf_counter() - t0

    def _add_logprobs(self, asking: list[tuple[Sequence, int, int, int]], got: list[Logprobs], seconds: float,
                      later: bool = False) -> None:
        piece = self.sampling.runner.vocab.piece
        for (seq, _, token, k), (logprob, top) in zip(asking, got):
            seq.logprobs.append(TokenLogprob(token, self.piece(seq, token), logprob,
                                             tuple((t, piece(t), lp) for t, lp in top[:k])))
        self.counters.logprob_tokens += len(asking)
        self.counters.logprob_later_tokens += len(asking) if later else 0
        self.counters.logprob_s += seconds

    def piece(self, seq: Sequence, token: int) -> bytes:
        """A picked token's text as the answer's text spells it: a thinking block's markers (gpt-oss's
        control tokens among them) written out, so that the coordinator finds where the thinking
        ends in the entries as in the text (runner/files/formats/rows.py answer_logprobs)."""
        return self.sampling.runner.vocab.piece(token, special=seq.think is not None and token in seq.think.marks)

    def _gen(self, seq: Sequence) -> GenerationParams:
        return seq.question.generation or self.gen

    def _constrain(self, seq: Sequence, spec: AnswerSpec) -> None:
        """Fixed choices that are each one token: answered from the logits; other choices and
        grammars: a grammar sampler of the sequence's own."""
        if spec.choices and spec.choice_logits:
            if spec.choices not in self._choice_tokens:
                self._choice_tokens[spec.choices] = self.sampling.choice_tokens(spec.choices)
            seq.choice_tokens = self._choice_tokens[spec.choices]
            if seq.choice_tokens is not None:
                return
        gbnf = choice_grammar(spec.choices) if spec.choices else spec.grammar
        if gbnf is not None:
            try:
                seq.grammar = self.sampling.new_grammar(gbnf)
            except ValueError as exc:  # the coordinator checked it: only a broken install gets here
                seq.error = str(exc)

    def _think_pick(self, seq: Sequence, index: int, greedy_token: int) -> tuple[int, bool]:
        """(a token, whether the model answers from this position without thinking). Thinking:
        the model's own token, unconstrained, or the end of its thinking written for it when the
        budget is spent (workers/engine/thinking.py), taken. Answering: the token the model chose
        first (greedy, or the chain's draw not yet accepted), which the answer's pick starts from
        under its grammar or choices."""
        think = seq.think
        token = think.next_forced()
        if token is None:
            token = greedy_token if seq.sampler is None else self.sampling.peek(seq.sampler, index)
            if think.answers_with(token):
                return int(token), True
        if seq.sampler is not None:
            self.sampling.accept(seq.sampler, token)
        think.see(token)
        return int(token), False
