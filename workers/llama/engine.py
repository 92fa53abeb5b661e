"""Continuous batching: many sequences share one llama.cpp context and one llama_decode per step.

    add(question) ──▶ Scheduler.waiting
    step():  admit    waiting → free slots, KV of the prompt's start copied in (workers/llama/slot_kv.py)
             schedule one token per decoding sequence + prompt chunks, within n_batch
             decode   one llama_decode (status 1 = no KV room: shrink the batch, then preempt)
             sample   each sequence's own sampler chain on its own logits row (workers/llama/picking.py)
             finish   EOG / stop string / max_tokens / context full → Answer (workers/engine/answers.py),
                      KV removed, slot freed
    ──▶ list[Answer] for the questions that finished in this step

The shared prefix (system prompt, few-shot examples: whatever every prompt starts with) is
decoded once into its own sequence when the engine starts and copied into each slot; with the
prefix cache a slot may start from any stream holding the start of its prompt (workers/llama/slot_kv.py).
On recurrent and hybrid memory a slot takes a stream only whole, and there is no prefix cache
(workers/engine/memory_kind.py).

KV layout, chosen per job by measurement (32 GSM8K prompts of ~79 tokens, 64 generated tokens
each, 32 slots, 2 threads, 28×1024 Q4_K_M model):
  one stream per sequence, flash attention   22.3-23.0 s   S_TG 147-151 tok/s
  one unified pool, flash attention          25.2-28.0 s   S_TG 120-125 tok/s
Separate streams win because each token's attention scans only its own sequence's cells, where
a unified pool makes every token scan every slot's cells. A unified pool wins when the prompts
share a long prefix: it stores the prefix once and a copy into a slot only tags cells, where
separate streams copy it physically into each (with a 545-token shared prefix: 37 s vs 61 s).
So the coordinator picks unified exactly when the shared prefix is longer than the rest of a
sequence (runner/plan/layout.py).

Flash attention's online softmax depends on how many KV cells it scans, which changes with the
rest of the batch, so at a near-tie a token can flip (2 of 64 greedy stories260K answers
differed between 1 and 16 slots in a unified pool). `batch_invariant: true` in a job picks
separate streams without flash attention and without repacked weights, and lays every batch out
so that each matrix product takes the same kernel whatever the batch (workers/engine/invariant.py:
decode steps of at least 8 tokens, with ballast tokens in free sequence ids when fewer
sequences decode; prompts fed alone in chunks of 8 or more): every float reduction then sees
the same numbers in the same order, and answers are bit-identical across slot counts including
1, layouts and prefix sharing (tested), at some cost in speed.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import asdict

import numpy as np

from ..engine import answers, invariant, loglik
from ..engine.answers import from_logits
from ..engine.batch import Batch, batch_arrays, logit_index, scored_rows
from ..engine.fits import length_problem
from ..engine.samples import SampleSet
from ..engine.scheduler import Scheduler, Span
from ..engine.sequence import Phase, Sequence
from ..engine.step_counters import StepCounters
from ..protocol import Answer, EngineConfig, GenerationParams, Question, kv_cells
from .later_logprobs import LaterLogprobs
from .model_runner import ModelRunner
from .picking import Picker
from .sampling import Sampling
from .slot_kv import SlotKv, slot_contents


class EngineError(RuntimeError):
    pass


class LlamaEngine:
    # Work out a step's token log-probabilities during the next decode where llama.cpp's threads
    # leave the worker's cores free (False: before it, always; bench/later_logprobs_bench.py compares).
    logprobs_beside_decode = True

    def __init__(self, config: EngineConfig, worker_id: int) -> None:
        self.config = config
        self.worker_id = worker_id
        self.slots = config.slots
        self.gen = config.generation
        self.n_ctx_seq = config.n_ctx_seq
        self.invariant = config.batch_invariant
        # The plan's budget already is step_budget's; an engine configured by hand gets it too.
        self.n_batch = invariant.step_budget(config.n_batch, config.slots, self.invariant)
        prefix = config.prefix_tokens
        if self.invariant and len(prefix) < invariant.MIN_ROWS:
            prefix = array("i")  # too short to decode alone in a batch-invariant shape
        streams = invariant.kv_streams(config.slots, self.invariant)
        self.prefix_id = invariant.prefix_seq_id(config.slots, self.invariant)
        n_ctx = config.kv_cells or kv_cells(config.slots, config.n_ctx_seq, len(prefix), config.kv_unified,
                                            self.invariant)
        self.runner = ModelRunner(config.model_path, config.n_threads, n_ctx=n_ctx, n_seq_max=streams,
                                  n_batch=self.n_batch, kv_unified=config.kv_unified,
                                  flash_attn=config.flash_attn, repack=config.repack)
        self.sampling = Sampling(self.runner)
        # With one unified pool, admission keeps the sequences within it; separate streams
        # give each slot its own room.
        budget = self.runner.n_ctx - len(prefix) if config.kv_unified else None
        self.counters = StepCounters()
        # What the model's memory can do decides where prompts may start (workers/engine/memory_kind.py).
        self.memory_kind = self.runner.memory_kind
        self.kv = SlotKv(self.runner, prefix, self.prefix_id,
                         slot_contents(config, prefix, self.prefix_id, self.memory_kind), self.counters)
        # With one stream per sequence, how llama.cpp cuts a batch into passes over the weights
        # depends on the sequence ids in it: the scheduler lays batches out for that.
        self.sched = Scheduler(config.slots, self.n_batch, prefix=prefix, kv_budget=budget,
                               max_new_tokens=self.gen.max_tokens, stream_per_sequence=not config.kv_unified,
                               batch_invariant=self.invariant, contents=self.kv.contents, memory=self.memory_kind,
                               n_ctx_seq=config.n_ctx_seq)
        # Cores llama.cpp's threads leave free during a decode (every layer on a GPU) work out the
        # last step's token log-probabilities meanwhile (workers/llama/later_logprobs.py).
        spare = self.sampling.host_thread_count - self.runner.n_threads
        later = LaterLogprobs(self.sampling, spare) if spare > 0 and self.logprobs_beside_decode else None
        self.picker = Picker(self.sampling, self.gen, self.counters, later)
        self._rejected: list[Answer] = []
        self._decode_prefix(prefix)

    # -- public interface -----------------------------------------------------------------------

    @property
    def n_threads(self) -> int:
        return self.runner.n_threads  # as llama.cpp reports it

    def set_threads(self, n: int) -> int:
        return self.runner.set_threads(n)

    @property
    def n_unfinished(self) -> int:
        return self.sched.n_unfinished + len(self._rejected)

    def add(self, question: Question) -> None:
        gen = question.generation or self.gen
        if question.continuations:  # scored, not generated (workers/engine/loglik.py)
            # Batch-invariant mode leaves every prompt MIN_ROWS tokens of its own: no forks there.
            forks = 0 if self.invariant else self.slots - 1
            seqs, ready = loglik.admit(question, self.n_ctx_seq, self.worker_id, gen.answer, forks)
            for seq in seqs:
                self.sched.add(seq)
            self._rejected += [ready] if ready is not None else []
            return
        samples = gen.sampling.n
        too_long = length_problem(question, self.n_ctx_seq)
        if too_long is not None:
            self._rejected.append(answers.rejected(question, self.worker_id, too_long))
        elif samples > self.slots:  # a line's own n past what memory (or --slots) left
            self._rejected.append(answers.rejected(
                question, self.worker_id, f"n: {samples} samples decode together, a slot each, and the worker has "
                                          f"{self.slots} slot{'' if self.slots == 1 else 's'} (the job's slots, or "
                                          "the memory plan): ask for fewer"))
        else:
            self.sched.add(Sequence(question, samples=SampleSet(samples) if samples > 1 else None))

    def step(self) -> list[Answer]:
        """schedule (admit, lay out the slots) → decode → sample → finish."""
        t0 = time.perf_counter()
        done, self._rejected = self._rejected, []
        done += self._admit()
        busy = len(self.sched.running)
        batch = self._decode_with_room()
        self._fork_continuations(batch.spans)
        done += self._score(batch)
        rows, tokens, n_outputs = self._sample(batch)
        ending = self._accept(rows, tokens)
        t1 = time.perf_counter()
        self.picker.record_logprobs(rows, tokens, n_outputs, {id(seq) for seq in ending})
        self.counters.sample_s += time.perf_counter() - t1
        for seq in ending:
            done += self._finish(seq)
        self.counters.generated_tokens += len(rows)
        self.counters.step(batch.spans, busy, time.perf_counter() - t0)
        return done

    def stats(self) -> dict[str, float]:
        return asdict(self.counters)

    def warm_up(self, n_tokens: int = 16) -> None:
        """Decode a few throw-away tokens in an empty slot, so that a timed first step does not
        also pay for the first use of llama.cpp's buffers (llama-batched-bench warms up alike)."""
        if self.sched.running:
            raise EngineError("warm_up() is for an engine that has not admitted a question yet")
        n = min(n_tokens, self.n_ctx_seq - 1, self.config.n_batch)
        status = self.runner.decode(np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32),
                                    np.zeros(n, np.int32), np.zeros(n, np.int8))
        if status != 0:
            raise EngineError(f"warm-up decode failed (llama_decode status {status})")
        self.kv.remove(0)

    def drop_waiting(self) -> int:
        """Forget the questions not yet admitted (stopping); returns how many."""
        return self.sched.drop_waiting()

    def close(self, keep_weights: bool = False) -> None:
        self.picker.close()
        for seq in self.sched.running:
            self.picker.free(seq)
        self.sampling.close()
        self.runner.close(keep_model=keep_weights)

    # -- internals ------------------------------------------------------------------------------

    def _decode_prefix(self, prefix: array[int]) -> None:
        tokens = np.frombuffer(prefix, dtype=np.int32)
        start = 0
        while start < len(tokens):
            left = len(tokens) - start
            # Batch-invariant: every chunk MIN_ROWS tokens or more, like a sequence's own prompt.
            n = invariant.chunk_len(left, self.n_batch) if self.invariant else min(left, self.n_batch)
            status = self.runner.decode(tokens[start:start + n], np.arange(start, start + n, dtype=np.int32),
                                        np.full(n, self.prefix_id, np.int32), np.zeros(n, np.int8))
            if status != 0:
                raise EngineError(f"decoding the shared prefix failed (llama_decode status {status})")
            start += n
        self.counters.prompt_computed += len(tokens)

    def _admit(self) -> list[Answer]:
        """Waiting questions into free slots (their shared prefix copied in, their sampler and
        grammar made), then, with one stream per sequence, busy slots moved down so the ids stay
        contiguous. Returns the answers of those whose grammar could not be built."""
        failed = []
        for seq in self.sched.admit():
            self.kv.start(seq)
            self.picker.prepare(seq)
            if seq.error is not None:
                failed += self._finish(seq)
        for seq, old_id in self.sched.compact():
            self.kv.move(seq, old_id)
        return failed

    def _fork(self, rows: list[tuple[Span, int, int]]) -> list[tuple[Span, int, int]]:
        """The rows with one more per sample forked now: a question of several samples whose
        prompt just went in has its KV copied into the slots it held, and each sample draws its
        first token from the same logits row (workers/engine/samples.py)."""
        out = list(rows)
        for span, index, row in rows:
            parent = span.seq
            if not parent.forks_now() or parent.samples is None:
                continue
            parent.samples.forked = True
            for i, slot in enumerate(list(parent.fork_ids), start=1):
                child = Sequence(parent.question, sample=i, samples=parent.samples)
                self.sched.fork(parent, child, slot)
                self.kv.fork(parent.seq_id, slot)
                self.picker.prepare(child)
                out.append((Span(child, span.start_pos, span.n, True), index, row))
        return out

    def _fork_continuations(self, spans: list[Span]) -> None:
        """A scored question's first sequence whose context but the last token just went in: the
        other continuations fork from its KV into the slots it held (workers/engine/loglik.py)."""
        for span in spans:
            parent = span.seq
            if parent.forks and parent.forks_now():
                for child, slot in zip(parent.forks, list(parent.fork_ids)):
                    self.sched.fork(parent, child, slot)
                    self.kv.fork(parent.seq_id, slot, sample=False)
                parent.forks = []

    def _score(self, batch: Batch) -> list[Answer]:
        """Read the rows the scored prompts of this batch asked for; the answers of the questions
        whose last continuation is now in (its sequence leaves at once: nothing is generated)."""
        scored, finishing = scored_rows(batch.spans), loglik.all_in(batch.spans)
        if not scored and not finishing:
            return []
        t0 = time.perf_counter()
        if scored:  # a step holding none of a sequence's scored rows reads none, yet may finish it
            flags = batch.arrays[3]
            loglik.read_batch(scored, flags, self.runner.logits(int(np.count_nonzero(flags))))
        done = []
        for seq in finishing:
            self._release(seq)
            answer = loglik.finished(seq, self.worker_id, self._gen(seq.scoring.parent).answer)
            done += [answer] if answer is not None else []
        self.counters.sample_s += time.perf_counter() - t0
        return done

    def _gen(self, seq: Sequence) -> GenerationParams:
        """The question's own generation settings, or the job's."""
        return seq.question.generation or self.gen

    def _accept(self, rows: list[tuple[Span, int, int]], tokens: list[int]) -> list[Sequence]:
        """Each sequence's token taken; those that finish with it (an end of generation, a stop
        string, max_tokens, the context full, a choice answered in one position, no token the
        grammar allows)."""
        ending = []
        for (span, _, _), token in zip(rows, tokens):
            seq = span.seq
            if seq.choice_scores is not None or token < 0:
                if token < 0:
                    seq.error = "the answer's grammar allows no token of this model's vocabulary here"
                ending.append(seq)
            elif seq.accept(token, self.picker.piece(seq, token), self.runner.vocab.is_eog(token), self._gen(seq),
                            self.n_ctx_seq):
                ending.append(seq)
        return ending

    def _sample(self, batch: Batch) -> tuple[list[tuple[Span, int, int]], list[int], int]:
        """(the rows, each sequence's next token, the decode's logits rows): the next token of
        every sequence that got logits, the greedy ones (no sampler) in one argmax over their rows,
        the others by their own llama.cpp sampler chain on their row."""
        t0 = time.perf_counter()
        rows = self._fork(batch.rows)
        tokens = [0] * len(rows)
        greedy = [i for i, (span, _, _) in enumerate(rows)
                  if span.seq.sampler is None and not from_logits(span.seq)]
        n_outputs = int(np.count_nonzero(batch.arrays[3])) if batch.arrays else 0  # none: an empty batch
        if greedy:
            for i, token in zip(greedy, self.sampling.greedy([rows[i][2] for i in greedy], n_outputs).tolist()):
                tokens[i] = token
        tokens = self.picker.pick_all([(span.seq, index) for span, index, _ in rows], tokens)
        self.counters.sample_s += time.perf_counter() - t0
        return rows, tokens, n_outputs

    def _layout(self, spans: list[Span]) -> Batch:
        """The arrays of one llama_decode for these spans; in batch-invariant mode with ballast
        and logits rows added as workers/engine/invariant.py requires."""
        arrays: tuple[np.ndarray, ...] = batch_arrays(spans)
        ballast: list[int] = []
        index = logit_index(spans)
        if self.invariant:
            arrays, ballast = invariant.lay_out(arrays, self.prefix_id)
        # Scored prompts ask for rows of their own besides the spans' last tokens.
        rows = invariant.output_rows(arrays[3], [i for _, i in index])
        return Batch(spans, arrays, ballast, [(span, i, row) for (span, i), row in zip(index, rows)])

    def _decode_with_room(self) -> Batch:
        """Decode the scheduled batch. When llama.cpp finds no KV room (status 1) the batch is
        halved and retried; when even one token has no room, the newest sequence is preempted.
        Batch-invariant mode preempts at once: a smaller batch would have another shape."""
        budget = self.n_batch
        while True:
            spans = self.sched.schedule(budget)
            if not spans:
                self.picker.join_logprobs()
                return Batch()
            batch = self._layout(spans)
            self.kv.clear_kept(batch.ballast)  # ballast starts at position 0 in an empty stream
            t0 = time.perf_counter()
            status = self.runner.decode(*batch.arrays)
            self.counters.decode_s += time.perf_counter() - t0
            # The last step's log-probabilities, worked out meanwhile, added before a preemption
            # resets a sequence and before any sampler reads this decode's rows.
            self.picker.join_logprobs()
            for seq_id in batch.ballast:
                self.kv.remove(seq_id)  # its stream is empty again, from cell 0
            if status == 0:
                for span in spans:
                    if span.seq.phase is Phase.PREFILL:
                        span.seq.n_cached += span.n
                        self.counters.prompt_computed += span.n
                self.counters.ballast_tokens += len(batch.ballast)
                return batch
            if status != 1:
                raise EngineError(f"llama_decode failed with status {status}")
            self.counters.kv_full_retries += 1
            n_tokens = sum(s.n for s in spans)
            if n_tokens > 1 and not self.invariant:
                budget = n_tokens // 2
            elif len(self.sched.running) > 1:
                self._preempt_newest()
            else:
                raise EngineError("no KV cache room for a single sequence")

    def _preempt_newest(self) -> None:
        victim, slot = self.sched.preempt_newest()
        self.kv.drop(slot)
        self.picker.free(victim)
        self.counters.preemptions += 1

    def _finish(self, seq: Sequence) -> list[Answer]:
        """The finished sequence's answer (none yet for a sample whose question waits for its
        other samples); its slot and sampler given back, and its KV too, or with the prefix cache
        its prompt's cells kept for the questions that share them."""
        complete = self.picker.answer_complete(seq)  # asked of its grammar before it is freed
        self.picker.free(seq)
        self._release(seq)
        answer = answers.answer(seq, self._gen(seq), self.worker_id, complete)
        whole = answer if seq.samples is None else seq.samples.finished(seq.sample, answer)
        return [whole] if whole is not None else []

    def _release(self, seq: Sequence) -> None:
        """A finished sequence's slot given back, and its KV, or with the prefix cache its prompt's
        cells kept (workers/llama/slot_kv.py)."""
        self.sched.release(seq)
        self.kv.finished(seq)
        seq.phase = Phase.FINISHED
