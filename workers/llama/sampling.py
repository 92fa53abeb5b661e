"""How a token is chosen: llama.cpp sampler chains, grammar samplers, fixed choices.

`Sampling` picks each sequence's next token from the logits of the last decode of a ModelRunner
(workers/llama/model_runner.py, the model, context and decode): one argmax over the greedy rows,
a sampler chain of the sequence's own for the others, a grammar asked first about the token
picked without it and masking the whole vocabulary only when it refuses that token (as
llama.cpp's common/sampling.cpp does), the log-probability of each of a question's fixed
choices, and of each generated token when asked. `grammar_problem` checks a grammar for the
coordinator before any worker starts.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence, cast

import llama_cpp
import numpy as np

from ..engine.constraints import ROOT, choice_spellings
from ..engine.logprobs import block_logprobs, tokens_logprobs
from ..engine.samples import llama_seed
from ..native_stderr import stderr_captured
from ..protocol import GenerationParams

# The backend and its log's ring of error lines belong to model_runner, which sets them up once.
from .llama_log import init_backend
from .model_runner import ModelRunner


def grammar_problem(gbnf: str) -> Optional[str]:
    """Why llama.cpp cannot parse this GBNF (its own error line), or None. The grammar is built
    once without a vocabulary (parsing needs none) and freed; the coordinator checks every grammar
    so before any worker starts, where a bad one would fail every question."""
    init_backend()
    # llama.cpp's grammar parser writes why straight to stderr (fprintf), not through its log.
    with stderr_captured() as said:
        sampler = llama_cpp.llama_sampler_init_grammar(None, gbnf.encode("utf-8"), ROOT.encode())
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
        return None
    why = [line.strip() for line in said if "error parsing grammar" in line]
    return why[0].split("error parsing grammar: ", 1)[1] if why else "llama.cpp cannot parse it"


# llama.h's llama_token_data {id, logit, p}, as a numpy record: a whole vocabulary of candidates is
# filled with two slice copies instead of a ctypes call per token.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class _Candidates:
    """One reusable llama_token_data_array over the whole vocabulary, and one of a single token
    (to ask a grammar whether it allows the token already picked, as llama.cpp's common/sampling.cpp
    does before constraining the whole vocabulary)."""

    def __init__(self, n_vocab: int) -> None:
        self.data = np.zeros(n_vocab, TOKEN_DATA)
        self.data["id"] = np.arange(n_vocab, dtype=np.int32)
        self.one = np.zeros(1, TOKEN_DATA)
        ptr = ctypes.POINTER(llama_cpp.llama_token_data)
        self.array = llama_cpp.llama_token_data_array(self.data.ctypes.data_as(ptr), n_vocab, -1, False)
        self.one_array = llama_cpp.llama_token_data_array(self.one.ctypes.data_as(ptr), 1, -1, False)
        self.n_vocab = n_vocab

    def fill(self, logits: np.ndarray) -> ctypes.Structure:
        """Every token with its logit, in id order (a sampler may have reordered and cut them)."""
        self.data["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.array.size, self.array.selected, self.array.sorted = self.n_vocab, -1, False
        return self.array

    def selected(self) -> int:
        # Through the struct's own pointer: a sampler may point it at a buffer of its own.
        return int(self.array.data[self.array.selected].id)

    def allows(self, grammar: llama_cpp.llama_sampler_p, token: int) -> bool:
        """Whether the grammar, in its current state, allows `token` next (it sets a refused
        token's logit to -inf)."""
        self.one[0] = (token, 0.0, 0.0)
        self.one_array.size, self.one_array.selected, self.one_array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(grammar, ctypes.byref(self.one_array))
        return bool(np.isfinite(self.one["logit"][0]))


def row_argmax(logits: np.ndarray, rows: list[int], pool: Optional[ThreadPoolExecutor] = None,
               threads: int = 1, floats_per_thread: int = 1) -> np.ndarray:
    """The argmax of each of these rows (ties: the lowest index); with a pool of `threads`, the
    rows are cut into at most that many runs of at least floats_per_thread values each."""
    first = rows[0]
    contiguous = rows == list(range(first, first + len(rows)))  # the usual case: views, no copy

    def argmax(a: int, b: int) -> np.ndarray:
        return cast(np.ndarray, (logits[first + a:first + b] if contiguous else logits[rows[a:b]]).argmax(axis=1))

    n_threads = min(threads, len(rows), len(rows) * logits.shape[1] // max(1, floats_per_thread))
    if pool is None or n_threads < 2:
        return argmax(0, len(rows))
    bounds = np.linspace(0, len(rows), n_threads + 1).astype(int).tolist()
    return np.concatenate(list(pool.map(argmax, bounds[:-1], bounds[1:])))


Logprobs = tuple[float, list[tuple[int, float]]]  # a token's, and the k most likely

# Token log-probabilities go to at most this many of the worker's threads: numpy lets go of the
# GIL inside each pass over a block and takes it back after, and the more threads wait for it,
# the longer each hand-over. On a 16-core GPU host, 32 rows of 151,936 logits took 8.2 ms on one
# thread, 4.4 ms spread row by row over 4 threads, 8.5 ms over 16 (and 15 ms a step inside a
# worker); their normalisers alone, in whole-block passes, 2.0 ms over 4 threads and 1.8 over 8
# (docs/performance/pools-and-weighing.md, "On a GPU: one H200").
LOGPROB_THREADS = 4
# Rows a thread works on at once: its buffer is this many rows (2.4 MB of a 151,936-token
# vocabulary), and its passes each cover them all.
LOGPROB_BLOCK_ROWS = 4


class Sampling:
    """The token choice of every sequence on one ModelRunner's context. Samplers and grammars
    are made per sequence (they keep its state) and given back with free_sampler."""

    # Ask a grammar about the token picked without it first (False: mask the whole vocabulary at
    # every step, as llama.cpp's plain grammar sampler does; bench/grammar_bench.py compares).
    grammar_check_first = True
    # The host's work between two decodes (the greedy argmax, the sampler chains, the token
    # log-probabilities) is spread over threads of the worker's own cores, while llama.cpp's
    # threads wait: with every layer on a GPU the worker holds its cores for one llama.cpp
    # thread, and the host's passes over 151,936-token rows are then as long as the GPU's step
    # (on an H200, docs/performance/gpu.md, the argmax of 255 rows took 10-12 ms on one core,
    # two thirds of llama-batched-bench's whole step). numpy and llama.cpp's calls let go of the
    # GIL. None: one thread per core the worker is pinned to (it is pinned before its engine is
    # made), also while threads_adapt has lowered llama.cpp's own threads: those make room for
    # other processes during the decode, and this work is a few milliseconds between two decodes.
    host_threads: Optional[int] = None
    # Each thread gets at least this many floats of rows (4 MB: well above a hand-off's cost).
    floats_per_thread = 1 << 20

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.vocab = runner.vocab
        self._candidates: Optional[_Candidates] = None  # made on the first grammar's first use
        self._threads = self.host_threads or len(os.sched_getaffinity(0))
        self._pool: Optional[ThreadPoolExecutor] = None  # made on first use
        self._scratch = threading.local()  # a token log-probability block buffer per thread

    def _host_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="host")
        return self._pool

    # -- sampling -------------------------------------------------------------------------------

    def new_sampler(self, gen: GenerationParams, seed: int) -> llama_cpp.llama_sampler_p:
        """A llama.cpp sampler chain for one sequence (it keeps that sequence's penalty history).
        A response format's grammar (gen.response_format, not enforced yet: protocol.py
        RESPONSE_FORMAT_ENFORCED) goes at the head of this chain."""
        defaults = llama_cpp.llama_sampler_chain_default_params()
        chain: llama_cpp.llama_sampler_p = llama_cpp.llama_sampler_chain_init(defaults)
        def add(s: llama_cpp.llama_sampler_p) -> None:
            llama_cpp.llama_sampler_chain_add(chain, s)
        params = gen.sampling
        if gen.logit_bias:
            add(self._logit_bias(gen.logit_bias))
        if params.repeat_penalty != 1.0:
            add(llama_cpp.llama_sampler_init_penalties(self.vocab.n_tokens, params.repeat_last_n,
                                                       params.repeat_penalty, 0.0, 0.0))
        if params.presence_penalty or params.frequency_penalty:  # over every token the answer may have
            add(llama_cpp.llama_sampler_init_penalties(self.vocab.n_tokens, gen.max_tokens, 1.0,
                                                       params.frequency_penalty, params.presence_penalty))
        if params.temperature <= 0.0:
            add(llama_cpp.llama_sampler_init_greedy())
            return chain
        if params.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        add(llama_cpp.llama_sampler_init_temp(params.temperature))
        add(llama_cpp.llama_sampler_init_dist(llama_seed(seed)))
        return chain

    def _logit_bias(self, bias: Sequence[tuple[int, float]]) -> llama_cpp.llama_sampler_p:
        """OpenAI's logit_bias: each value added to its token's logit (llama.cpp copies the array)."""
        entries = (llama_cpp.llama_logit_bias * len(bias))(*(llama_cpp.llama_logit_bias(t, b) for t, b in bias))
        return cast("llama_cpp.llama_sampler_p",  # declared under TYPE_CHECKING alone
                    llama_cpp.llama_sampler_init_logit_bias(self.vocab.n_tokens, len(bias), entries))

    def greedy(self, rows: list[int], n_outputs: int) -> np.ndarray:
        """Argmax of the given rows of the last decode's n_outputs logits rows (stored in batch
        order), by numpy: a llama.cpp greedy sampler would copy the whole vocabulary into a
        candidate array per sequence first. Ties go to the lowest token id, as in llama.cpp.
        Many rows are split among the worker's cores (row_argmax)."""
        logits = self._logits(n_outputs)
        if not self._spreads(len(rows)):
            return row_argmax(logits, rows)
        return row_argmax(logits, rows, self._host_pool(), self._threads, self.floats_per_thread)

    def _logits(self, n_outputs: int) -> np.ndarray:
        """The last decode's n_outputs logits rows, as llama.cpp holds them (read only: the next
        decode writes over them)."""
        ptr = llama_cpp.llama_get_logits(self.runner.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.vocab.n_tokens))

    def _spreads(self, n_rows: int) -> bool:
        """Whether n_rows of host work are worth spreading over the worker's cores."""
        return self._threads > 1 and n_rows > 1 and n_rows * self.vocab.n_tokens >= 2 * self.floats_per_thread

    def sample(self, sampler: llama_cpp.llama_sampler_p, batch_index: int) -> int:
        """Sample from the logits row of batch position `batch_index` (also accepts the token)."""
        return int(llama_cpp.llama_sampler_sample(sampler, self.runner.ctx, batch_index))

    def sample_many(self, chains: Sequence[tuple[llama_cpp.llama_sampler_p, int]]) -> tuple[list[int], bool]:
        """(sample() of several sequences' chains, each on its batch position; whether they were
        spread over the worker's cores). A chain keeps its own state (its candidate buffer, its
        random generator, its penalty history)."""
        if not self._spreads(len(chains)):
            return [self.sample(chain, index) for chain, index in chains], False
        self._read_first(chains[0][1])
        return list(self._host_pool().map(lambda c: self.sample(*c), chains)), True

    def _read_first(self, batch_index: int) -> None:
        """Each logits read waits for the decode and puts the context's rows in batch order first
        (llama_context synchronize and output_reorder): the first read after a decode is made in
        the calling thread, so that in the host threads both find their work done and only read."""
        llama_cpp.llama_get_logits_ith(self.runner.ctx, batch_index)

    def peek(self, chain: llama_cpp.llama_sampler_p, batch_index: int) -> int:
        """The token the chain picks on this row, not yet accepted into its history (sample() is
        peek() then accept())."""
        cands = self._candidates_for()
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(cands.fill(self._row(batch_index))))
        return cands.selected()

    @staticmethod
    def accept(sampler: llama_cpp.llama_sampler_p, token: int) -> None:
        """A token chosen without the chain (a forced end of thinking) joins its history."""
        llama_cpp.llama_sampler_accept(sampler, token)

    @staticmethod
    def free_sampler(sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_free(sampler)

    # -- answers of a required shape: fixed choices, grammars ------------------------------------

    def new_grammar(self, gbnf: str) -> llama_cpp.llama_sampler_p:
        """A grammar sampler for one sequence (it keeps that sequence's parse state)."""
        vocab, text = self.vocab.vocab, gbnf.encode("utf-8")
        sampler: llama_cpp.llama_sampler_p = llama_cpp.llama_sampler_init_grammar(vocab, text, ROOT.encode())
        if not sampler:
            raise ValueError(f"llama.cpp cannot parse the grammar: {grammar_problem(gbnf)}")
        return sampler

    def grammar_complete(self, grammar: llama_cpp.llama_sampler_p) -> bool:
        """Whether the grammar, in its state, lets the answer end here: llama.cpp allows an
        end-of-generation token only where the root rule is complete."""
        vocab = self.vocab.vocab
        ends = [t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if t >= 0]
        return not ends or self._candidates_for().allows(grammar, ends[0])

    def choice_tokens(self, choices: Sequence[str]) -> Optional[tuple[tuple[int, ...], ...]]:
        """Per choice, every token that spells it alone, bare or after one space (`B`, ` B`, and
        a byte token `<0x42>` where the vocabulary has byte tokens): any of them, picked first,
        would be the whole answer. None when some choice has no such token (it takes more than
        one token to generate). One pass over the vocabulary."""
        spelled = self.vocab.tokens_spelling({v for c in choices for v in choice_spellings(c)})
        out = tuple(tuple(sorted(t for v in choice_spellings(c) for t in spelled.get(v, ()))) for c in choices)
        return None if not all(out) else out

    def _row(self, batch_index: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.runner.ctx, batch_index)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab.n_tokens,))

    def choice_scores(self, batch_index: int, variants: Sequence[Sequence[int]]) -> list[float]:
        """Each choice's log-probability at this position (log-softmax over the whole
        vocabulary), its best token variant's: the number the token's log-probability entry
        shows (tokens_logprobs, the same arithmetic)."""
        row = self._row(batch_index)
        best = [max(tokens, key=lambda token: float(row[token])) for tokens in variants]
        return tokens_logprobs(row, best, self._block()[0])

    def likeliest(self, batch_index: int, tokens: Sequence[int]) -> int:
        """Of these tokens (one choice's variants), the one the model gives the most weight at
        this position: the token its score is read from. A tie goes to the earliest."""
        row = self._row(batch_index)
        return max(tokens, key=lambda token: float(row[token]))

    def token_logprobs(self, rows: Sequence[int], tokens: Sequence[int], k: int, n_outputs: int) -> list[Logprobs]:
        """Each picked token's log-probability and the k most likely tokens, from these rows of the
        last decode's n_outputs raw logits rows (stored in batch order; workers/engine/logprobs.py):
        read before any sampler, which works on a copy, so the distribution is the model's own.
        Each row is copied into a block of its thread's own, LOGPROB_BLOCK_ROWS rows a pass."""
        logits = self._logits(n_outputs)

        def run(a: int, b: int) -> list[Logprobs]:
            block: np.ndarray = self._block()
            out: list[Logprobs] = []
            for c in range(a, b, LOGPROB_BLOCK_ROWS):
                part = block[:min(LOGPROB_BLOCK_ROWS, b - c)]
                for j, row in enumerate(rows[c:c + len(part)]):
                    part[j] = logits[row]
                out += block_logprobs(part, tokens[c:c + len(part)], k, part)
            return out
        return self._spread_logprobs(len(rows), run, self._threads)

    def copied_logprobs(self, block: np.ndarray, tokens: Sequence[int], k: int, threads: int) -> list[Logprobs]:
        """token_logprobs of rows already copied out of llama.cpp's (block: a row for each token),
        worked on in place, over at most `threads` of the worker's threads."""
        def run(a: int, b: int) -> list[Logprobs]:
            out: list[Logprobs] = []
            for c in range(a, b, LOGPROB_BLOCK_ROWS):
                end = min(c + LOGPROB_BLOCK_ROWS, b)
                out += block_logprobs(block[c:end], tokens[c:end], k, block[c:end])
            return out
        return self._spread_logprobs(len(tokens), run, threads)

    def _spread_logprobs(self, n_rows: int, run: Callable[[int, int], list[Logprobs]],
                         threads: int) -> list[Logprobs]:
        """run(a, b) over rows a to b; many rows cut into runs for at most LOGPROB_THREADS of
        `threads` threads."""
        n = min(threads, LOGPROB_THREADS, n_rows * self.vocab.n_tokens // self.floats_per_thread)
        if n < 2:
            return run(0, n_rows)
        bounds = np.linspace(0, n_rows, n + 1).astype(int).tolist()
        return [got for part in self._host_pool().map(run, bounds[:-1], bounds[1:]) for got in part]

    def copy_rows(self, rows: Sequence[int], n_outputs: int, into: Optional[np.ndarray]) -> np.ndarray:
        """These rows of the last decode's n_outputs logits rows, copied in order into `into`'s
        first rows: it is returned, or a larger buffer where it holds too few."""
        logits = self._logits(n_outputs)
        if into is None or len(into) < len(rows):
            into = np.empty((len(rows), self.vocab.n_tokens), np.float32)
        for j, row in enumerate(rows):
            into[j] = logits[row]  # row by row: numpy's take(out=) took four times as long
        return into

    @property
    def host_thread_count(self) -> int:
        """Threads of the worker's cores the host's work is spread over."""
        return self._threads

    def _block(self) -> np.ndarray:
        """This thread's buffer of LOGPROB_BLOCK_ROWS rows, made on its first use."""
        block = getattr(self._scratch, "block", None)
        if block is None:
            block = self._scratch.block = np.empty((LOGPROB_BLOCK_ROWS, self.vocab.n_tokens), np.float32)
        return block

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _candidates_for(self) -> _Candidates:
        if self._candidates is None:
            self._candidates = _Candidates(self.vocab.n_tokens)
        return self._candidates

    def constrain_greedy(self, grammar: llama_cpp.llama_sampler_p, batch_index: int, token: int) -> tuple[int, bool]:
        """(the greedy token the grammar allows, whether `token`, the unconstrained argmax, was
        refused); -1 when the grammar allows no token at all. The token is accepted by the grammar."""
        cands = self._candidates_for()
        if self.grammar_check_first and cands.allows(grammar, token):
            llama_cpp.llama_sampler_accept(grammar, token)
            return token, False
        llama_cpp.llama_sampler_apply(grammar, ctypes.byref(cands.fill(self._row(batch_index))))
        logits = cands.data["logit"]
        best = int(logits.argmax())  # the lowest id among equal logits, as llama.cpp's greedy
        if not np.isfinite(logits[best]):
            return -1, True
        llama_cpp.llama_sampler_accept(grammar, best)
        return best, True

    def sample_constrained(self, chain: llama_cpp.llama_sampler_p, grammar: llama_cpp.llama_sampler_p,
                           batch_index: int, drawn: Optional[int] = None) -> tuple[int, bool]:
        """Sample with the chain unconstrained; only when the grammar refuses that token, sample
        again with the grammar masking the whole vocabulary first (llama.cpp's common/sampling.cpp
        does the same: masking every token at every step is what makes grammars slow). `drawn`:
        the chain's unconstrained draw on this row already made (peek(), while a reasoning model
        chose between thinking and answering), asked about instead of drawing again. Returns
        (token, whether it was resampled); -1 when the grammar allows no token at all."""
        cands = self._candidates_for()
        row = self._row(batch_index)
        if drawn is None:
            llama_cpp.llama_sampler_apply(chain, ctypes.byref(cands.fill(row)))
            drawn = cands.selected()
        token, resampled = drawn, False
        if not self.grammar_check_first or not cands.allows(grammar, token):
            resampled = True
            arr = cands.fill(row)
            llama_cpp.llama_sampler_apply(grammar, ctypes.byref(arr))
            if not np.isfinite(cands.data["logit"]).any():
                return -1, True
            llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
            token = cands.selected()
        llama_cpp.llama_sampler_accept(grammar, token)
        llama_cpp.llama_sampler_accept(chain, token)
        return token, resampled
