"""ggbatch.Pool: the workers started and the model loaded once, then answering calls from any
number of threads, whose questions share the workers' batches. The same pieces as a job
(runner/job.py): the layout and the workers' specs (runner/launch.py), the worker pool with its
dispatch and crash handling (runner/pool/), the watch (memory, stalls, threads: runner/watch/);
the pool's run is one long WorkerPool.run whose feed is the calls (runner/warm/intake.py).

    caller threads: answer / submit ─▶ records ─▶ questions (tokenizer, under a lock) ─▶ Calls.open
                                                                      └▶ Submissions.put
    loop thread:    WorkerPool.run(feed=Submissions) ─▶ workers ─▶ RunWatch ─▶ Calls.append ─▶ Resolver
    resolver threads: Future.set_result ─▶ its done-callbacks (which may call the pool: not on the loop)

close() (or leaving `with`): the calls still open are answered, then every worker stops; leaving
on an exception (Ctrl-C included) cancels them instead and kills the workers at once.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from array import array
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

from ...workers.engine.interface import EngineFactory
from ...workers.llama.factory import LLAMA_ENGINE
from ...workers.protocol import Answer, Question
from ..child_processes import leave_if_importing_script
from ..config.answer import job_answer
from ..config.schema import JobConfig
from ..errors import ConfigError, WorkerFailure
from ..files.inputs import Record
from ..launch import STREAMED, open_backend, settle, start_layout, worker_specs
from ..model.identity import check_local_model, identify, resolve_model
from ..plan.growth import ContextGrowth
from ..plan.layout import PromptFacts
from ..pool.pool import WorkerPool
from ..questions.maker import QuestionMaker
from ..questions.prepare import SharingNote, order
from ..questions.prompting import Prompting
from ..questions.prompts import check_templates, question_field_read, template_fields
from ..questions.tokenizing import tokenize_all
from ..watch.startup_load import SinceStart
from ..watch.watch import RunWatch
from .calls import Answered, Calls, NoReuse
from .events import PoolEvents
from .facts import call_facts, first_slots, probe_records, warm_facts
from .intake import Submissions, load_of, too_wide
from .overrides import SOURCE, Variant, Variants, pool_config, said_by_call
from .pool_errors import PoolClosed, Untokenizable
from .records import caller_namer, caller_records, caller_rows, caller_texts, check_vocabulary
from .resolver import Resolver
from .starting import start_in_thread
from .stats import pool_stats

log = logging.getLogger("ggbatch")
_T = TypeVar("_T")


class Pool:
    """Workers and a model held across calls. `with ggbatch.Pool(model="m.gguf", max_tokens=64) as
    pool: pool.answer(["2+2?"])`. Settings are the job's keys that name no file. `start_small`: with
    auto slots, start with FIRST_WARM_SLOTS a worker and grow once calls bring more (every slot's KV
    is allocated as the pool starts); False plans every slot the cap and the memory allow from the
    start, for calls that always bring many questions to generate for."""

    _per_question = False  # each question brings its own generation (starting's per_question)

    def __init__(self, model: str, *, engine_factory: EngineFactory = LLAMA_ENGINE, start_small: bool = True,
                 **settings: Any) -> None:
        config, layer = pool_config(model, settings)
        self._start(config, layer, SOURCE, [], engine_factory, start_small)

    @classmethod
    def starting(cls, model: str, *, engine_factory: EngineFactory = LLAMA_ENGINE, start_small: bool = True,
                 per_question: bool = False, **settings: Any) -> "Future[Pool]":
        """Pool(), returning at once: the settings and a local model file are checked here (a
        typo, a missing file, a grammar, JSON schema, prompt.template or prompt.chat_template that
        cannot be parsed raises now; a chat template's rendering, as the pool starts), the workers, the
        tokenizer and the model start in a thread meanwhile; the Future holds the pool, or why it
        could not start. It is running from the start, so it cannot be cancelled: close the pool it
        gives (a process that exits meanwhile waits for the start, then closes it). For a caller
        with work of its own first: lm-eval builds its tasks while the model loads (ggbatch.lm_eval).
        `per_question`: each question brings its own generation (lm-eval's): no max_tokens warning."""
        config, layer = pool_config(model, settings)
        check_local_model(config.model)
        with said_by_call(SOURCE, {}):  # these need no model: said now, not by .result()
            job_answer(config)
            check_templates(config.prompt_template, config.chat_template, config.system)
        return start_in_thread(lambda: cls.for_call(config, layer, SOURCE, [], engine_factory, start_small,
                                                    per_question),
                               Pool._at_exit, lambda pool: pool._resources)

    @classmethod
    def for_call(cls, config: JobConfig, layer: Mapping[str, Any], source: str, records: list[Record],
                 engine_factory: EngineFactory = LLAMA_ENGINE, start_small: bool = True, per_question: bool = False
                 ) -> "Pool":
        """A pool planned for these records (ggbatch.answer: one call), as a job is for its file."""
        pool = cls.__new__(cls)
        pool._per_question = per_question
        pool._start(config, layer, source, records, engine_factory, start_small)
        return pool

    # -- start -----------------------------------------------------------------------------------

    def _start(self, config: JobConfig, layer: Mapping[str, Any], source: str, records: list[Record],
               engine_factory: EngineFactory, start_small: bool) -> None:
        leave_if_importing_script()
        self._source, self._config, self._closed = source, config, False
        self._owner = os.getpid()  # a forked child's copy would wait for good on the tokenizer pipe
        self._groups, self._sharing = 0, SharingNote()  # prefix groups numbered so far (submit_questions), their line
        # calls are made one at a time, each handed to the loop before a close begins (which answers it)
        self._make_lock = threading.RLock()
        self._close_lock = threading.Lock()  # a second close() waits for the first to end
        self._ready = threading.Event()
        self._ended: Optional[BaseException] = None
        self._resources = ExitStack()
        try:
            self._open(config, layer, records, engine_factory, start_small)
        except BaseException:
            self._resources.close()
            raise

    def _open(self, config: JobConfig, layer: Mapping[str, Any], records: list[Record],
              engine_factory: EngineFactory, start_small: bool) -> None:
        began = time.perf_counter()  # the pool's age (stats' elapsed_s) counts its start-up and load too
        since_start = SinceStart() if config.threads_adapt == "auto" else None
        model_path = resolve_model(config.model)
        with said_by_call(self._source, {}):  # a schema, grammar or template is checked as it is used
            model, answer = identify(model_path), job_answer(config)
        backend = self._resources.enter_context(open_backend(config))
        started = start_layout(config, model, records, len(records) or STREAMED, True, backend.nodes())
        specs = worker_specs(started, model_path, engine_factory)
        self._workers = self._resources.enter_context(WorkerPool(specs, backend=backend, keep_answers=False,
                                                                 model=model))
        self._workers.start()  # the model loads while the tokenizer starts
        with said_by_call(self._source, {}):
            self._prompting = self._resources.enter_context(Prompting(config, model_path, answer))
        self._variants = Variants(layer, self._source, config, self._prompting, self._make_lock)
        self._resolver = Resolver("ggbatch-pool-answers")
        facts, prefix, most = self._facts(records)
        first = first_slots(start_small, bool(records), started.layouts[0].n_gpu_layers)
        growth = settle(config, started, self._prompting, facts, prefix, most, model_path, first_slots=first,
                        most_said_by=None if self._per_question else "max_tokens")
        self._workers.keep(growth.plan.node_of())
        load = load_of(self._prompting.generation)
        self._calls = Calls(config.id_field, config.keep_thinking, lambda qids: self._intake.withdraw(qids),
                            self._resolver, load)
        self._watch = self._resources.enter_context(
            RunWatch("off", began, since_start is not None, self._calls, since_start, self._sharing.memory_known))
        self._watch.start_run(0, self._prompting.generation.max_tokens, growth.slots, self._workers)
        self._growth = growth
        self._intake = Submissions(growth, self._workers.reconfigure, lambda: self._calls.open_sequences, load)
        self._n_workers = len(self._workers.workers)
        self._thread = threading.Thread(target=self._loop, args=(growth,), name="ggbatch-pool", daemon=True)
        self._thread.start()
        self._resources.callback(self._stop)
        atexit.register(self._at_exit)
        self._resources.callback(atexit.unregister, self._at_exit)
        self._ready.wait()
        if self._ended is not None:
            raise self._ended

    def _facts(self, records: list[Record]) -> tuple[PromptFacts, array[int], int]:
        """What the layout is planned on (runner/warm/facts.py): a call's records (ggbatch.answer),
        or a warm pool's probes."""
        default = self._variants.default
        if records:
            return call_facts(len(records), self._make(records, default, self._method("answer"))[2], self._prompting)
        fields = template_fields(self._config.prompt_template, self._config.question_field)
        try:
            probes = self._make(probe_records(fields), default, self._source)[2]
        except ConfigError:  # a template reading record["..."]: no probe to make, no shared prefix known
            probes = []
        return warm_facts(probes, self._prompting, self._config.prefix_cache == "auto")

    # -- the loop thread -------------------------------------------------------------------------

    def _loop(self, growth: ContextGrowth) -> None:
        try:
            self._workers.run([], growth.engines(), self._intake, feed_below=STREAMED,
                              events=PoolEvents(self._watch, self._on_ready))
        except BaseException as exc:  # the workers are gone: every call waiting is told why
            self._ended = exc
        finally:
            self._calls.end(self._ended or PoolClosed(f"{self._source}: the pool was closed"))
            self._ready.set()

    def _on_ready(self) -> None:
        if sum(w.ready is not None for w in self._workers.workers) >= len(self._workers.workers):
            self._ready.set()

    # -- calls -----------------------------------------------------------------------------------

    def submit_many(self, questions: Union[str, Iterable[Any]], **overrides: Any) -> "Future[list[Answered]]":
        """answer(), without waiting: a Future of the list."""
        return self._submit(questions, overrides, self._method("submit_many"))

    def _method(self, name: str) -> str:
        """How errors name the caller's call: the pool's method it called (ggbatch.Pool.submit());
        a pool made for one ggbatch.answer() call is that function's."""
        return f"{self._source[:-2]}.{name}()" if self._source == SOURCE else self._source

    def _submit(self, questions: Union[str, Iterable[Any]], overrides: Mapping[str, Any], where: str,
                single: bool = False) -> "Future[list[Answered]]":
        self._check_usable(where)  # first: a call's own choices go through the tokenizer process too
        rows = caller_rows(questions, self._config.id_field, self._config.question_field, where, single)
        records = caller_records(rows, self._config.id_field,
                                 question_field_read(self._config.prompt_template, self._config.question_field),
                                 where, single)
        with self._make_lock:
            # a call's new choices are checked through the tokenizer process: one that died restarts
            variant = self._tokenizing(lambda: self._variants.of(overrides, where), where)
            maker, rejected, made = self._make(records, variant, where, single)
            made, wide = too_wide(made, self._prompting.generation, self._growth.most_per_worker)
            rejected.update(wide)
            future, sent = self._calls.open(list(maker.ids.answered_as()), made, rejected)
            self._intake.put(sent)
        return future

    def answer(self, questions: Union[str, Iterable[Any]], **overrides: Any) -> list[Answered]:
        """Answer these questions (strings, or records with the question field), in their order,
        as ggbatch.answer does. Overrides for this call: max_tokens, sampling, choices, schema
        or grammar, system."""
        return self._submit(questions, overrides, self._method("answer")).result()

    def submit(self, question: Union[str, Mapping[str, Any]], **overrides: Any) -> "Future[Answered]":
        """One question's answer, as a Future; the calls of many threads share the workers' batches."""
        return self._calls.one(self._submit([question], overrides, self._method("submit"), single=True))

    def submit_questions(self, questions: Sequence[Question],
                         on_answered: Optional[Callable[[list[Answered]], None]] = None) -> "Future[list[Answered]]":
        """Questions already tokenized (distinct ids; ggbatch.lm_eval's), as they are: their own
        generation settings or the pool's, continuations scored. Those sharing a prefix go out
        together (runner/questions/prefix_groups.py), for the workers' prefix cache. on_answered
        hears each batch's answers as they come, before the Future resolves (from the pool's
        thread: keep it short, as a queue's put is)."""
        self._check_usable(f"{self._source}.submit_questions()")
        for question in questions:
            check_vocabulary(question, self._prompting.info.n_vocab, f"{self._source}.submit_questions()")
        ordered, sharing = order(list(questions), self._config.prefix_cache == "auto")
        self._sharing.add(sharing)
        with self._make_lock:
            self._check_usable(f"{self._source}.submit_questions()")  # closed meanwhile
            ordered = [replace(q, group=q.group + self._groups) if q.group else q for q in ordered]
            self._groups += max((q.group for q in ordered), default=0)
            ordered, wide = too_wide(ordered, self._prompting.generation, self._growth.most_per_worker)
            future, sent = self._calls.open([(q.qid, q.qid) for q in questions], ordered, wide, on_answered)
            self._intake.put(sent)
        return future

    def tokenize(self, texts: Union[str, Sequence[str]], add_bos: bool = True,
                 names: Optional[Sequence[str]] = None) -> list[array[int]]:
        """Each text's tokens by the model's tokenizer (special tokens written in it parsed as such),
        BOS first if asked and the text does not start with the BOS text already (a chat template
        may write it: chat_prompt), as a job's prompts are tokenized. `names`: how an error names
        each text (ggbatch.lm_eval's task and doc); without, the text's index."""
        where = self._method("tokenize")
        self._check_usable(where)
        asked = [(t, add_bos and self._prompting.builder.needs_bos(t)) for t in caller_texts(texts, where)]
        out = self._tokenizing(lambda: list(tokenize_all([self._prompting.tokenizer], asked)), where)
        bad = next(((i, t) for i, t in enumerate(out) if not isinstance(t, array)), None)
        if bad is not None:
            name = names[bad[0]] if names is not None else f"texts[{bad[0]}]"
            raise Untokenizable(where, name, bad[1].reason)
        return [t for t in out if isinstance(t, array)]

    def chat_prompt(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation ({"role", "content"} turns) as the pool's questions
        are made: its chat template (the model's unless chat_template says otherwise) and system
        prompt, ready for the assistant's answer; add_generation_prompt False: ending right after
        the last message's text, left open for the model to continue (as lm-eval asks for a task's
        gen_prefix, and Hugging Face's continue_final_message does)."""
        turns = [(m["role"], m["content"]) for m in messages]
        return self._prompting.builder.render_messages(turns, continue_final=not add_generation_prompt)

    @property
    def prompt_fingerprint(self) -> str:
        """A short hash of what chat_prompt writes with (template, system prompt, template arguments)."""
        return self._prompting.builder.fingerprint()

    @property
    def chat_template(self) -> Optional[str]:
        """The chat template's text; None for ggbatch's plain one (a model without a template)."""
        return self._prompting.template

    @property
    def n_ctx_train(self) -> int:
        return self._prompting.info.n_ctx_train

    @property
    def special_texts(self) -> tuple[str, str]:
        """The model's BOS and EOS tokens as text."""
        return self._prompting.info.bos_text, self._prompting.info.eos_text

    def _make(self, records: list[Record], variant: Variant, where: str,
              single: bool = False) -> tuple[QuestionMaker, dict[str, Answer], list[Question]]:
        """The records' questions (`where`: the call, as its errors name it; `single`: of one question)."""
        name = caller_namer(single)

        def make() -> tuple[QuestionMaker, list[Question]]:
            maker = QuestionMaker(variant.builder, [self._prompting.tokenizer], variant.config, variant.generation,
                                  self._prompting.info.n_vocab, self._prompting.unknown_token, NoReuse(),
                                  where=lambda rec: f"{where}: {name(rec.line - 1)}")  # caller_records' lines
            return maker, maker.make(records)

        maker, questions = self._tokenizing(make, where)
        if variant.own:
            questions = [q if q.generation is not None else replace(q, generation=variant.generation)
                         for q in questions]
        return maker, dict(maker.made.rejected), questions

    def _check_usable(self, where: str) -> None:
        """PoolClosed, before any work, for a call on a closed pool or from another process than
        the one that made the pool (a fork child: the pool's processes and thread are not its)."""
        if os.getpid() != self._owner:
            raise PoolClosed(f"{where}: this pool belongs to process {self._owner}, which made it; "
                             f"make a pool in this process (pid {os.getpid()}) to answer from it")
        if self._closed:
            raise PoolClosed(f"{where}: the pool is closed")

    def _tokenizing(self, work: Callable[[], _T], where: str) -> _T:
        """work() with the tokenizer process, one call at a time (`where`: the call, as an error
        names it); a tokenizer process that died is started again once, and the work done again."""
        with self._make_lock:
            if self._closed:  # closed while this call waited for the tokenizer
                raise PoolClosed(f"{where}: the pool is closed")
            try:
                return work()
            except WorkerFailure as exc:
                log.warning("%s: %s; starting a new one", self._source, exc)
                self._prompting.restart_tokenizer()
                return work()

    # -- the rest --------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The report's counters so far: answers, tokens, rates, slots, each worker's memory and restarts."""
        return pool_stats(self._workers, self._watch, self._calls, self._watch.started, self._growth.slots)

    def close(self) -> None:
        """Answer the calls still open, then stop every worker; idempotent, and a close from
        another thread meanwhile returns when this one has ended."""
        with self._close_lock:
            if not self._closed:
                with self._make_lock:  # a call being made is handed to the loop first, and answered
                    self._closed = True
                if os.getpid() == self._owner:  # a fork child's copy leaves the maker's workers alone
                    self._resources.close()

    def _at_exit(self) -> None:
        """A pool still open when the interpreter exits (lm-eval never closes its model) is closed
        before multiprocess's own exit handler terminates its workers, which the pool's loop would
        report as deaths; its open calls are cancelled, not waited for."""
        if self._calls.n_open:
            self._intake.cancel(PoolClosed(f"{self._source}: the process is exiting"))
        self.close()

    def _stop(self) -> None:
        try:
            self._intake.finish()
            self._thread.join()
        finally:  # a second Ctrl-C while joining: the workers are killed all the same
            if self._thread.is_alive():
                self._intake.cancel(PoolClosed(f"{self._source}: the pool was closed"))
                self._thread.join()
            self._intake.close()
            self._resolver.close()  # every Future resolved when close() returns

    def __reduce__(self) -> Any:
        # Python's own refusal names a lock deep inside ('_thread.lock'), not the pool
        raise TypeError(f"{self._source}: a pool cannot be pickled (sent to another process): its workers are "
                        "this process's; make a pool in the process that uses it (docs/guide/python-api.md)")

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and not self._closed:
            self._intake.cancel(PoolClosed(f"{self._source}: the pool was left on an error"))
        self.close()


__all__ = ["Answered", "Pool", "PoolClosed"]
