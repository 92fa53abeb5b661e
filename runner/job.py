"""One job from start to finish, told in order by run_job: check the files and the model, start
the workers, make the first window of questions while they load, reuse what the journal holds,
settle the layout, answer the rest (a streamed file's next windows made meanwhile), write the
answers from the journal and the report.

    question file (runner/files/inputs.py, runner/files/formats) ─▶ records (of one shard: runner/files/shards.py)
    first window ─▶ Preparer (runner/questions/prepare.py; journal reuse) ─▶ layout.settle ─▶ WorkerPool.run
    next windows ─▶ QuestionFeed (runner/questions/feed.py, a thread) ────────────────────────▶ │
    (the layout per node: this machine, or each Ray node with --backend ray; runner/plan/nodes.py)
                                                                                     │
    answers file ◀── rows in input order (duplicates fanned out) ◀── journal ◀──────┘
    (its format: runner/files/formats; without an answer, to errors_output when set)

A file of more than `window` records streams: the coordinator keeps a few windows of questions
and a few bytes for every question before them (runner/files/compact.py), never the whole file; a
window whose prompts need a larger context than the first one's grows it (runner/plan/growth.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Optional

from ..workers.engine.interface import EngineFactory
from ..workers.llama.factory import LLAMA_ENGINE
from ..workers.protocol import EngineConfig
from .child_processes import leave_if_importing_script
from .config.answer import job_answer
from .config.schema import CHOICES_AUTO, LOGLIKELIHOOD, JobConfig, key_said_in_file, model_said_in_file
from .errors import ConfigError, InputError, Interrupted, JournalError, ModelError, OutputError, WorkerFailure
from .files.formats.cells import check_id_column
from .files.formats.detect import errors_format, output_format
from .files.formats.rows import OutputSpec, Row, not_answered
from .files.inputs import QuestionStream, Record, open_question_file
from .files.lock import OutputLock
from .files.outputs import remove_stale_copies, write_answers, write_atomic
from .files.paths import REPORT, JobPaths, job_paths
from .files.piped import readable_input
from .files.shards import Shard, in_shard
from .journal.fingerprint import fingerprint
from .journal.index import Earlier, start_reading
from .journal.journal import Journal
from .launch import STREAMED, open_backend, settle, start_layout, worker_specs
from .model.identity import ModelIdentity, identify, resolve_model
from .plan import layout as layouts
from .plan.growth import ContextGrowth
from .plan.nodes import NodePlan, node_report
from .pool.pool import WorkerPool
from .pool.signals import STOP
from .questions.feed import QuestionFeed
from .questions.prepare import (
    WINDOW,
    Preparer,
    Window,
    check_requests,
    check_sample_slots,
    facts,
    max_samples,
    max_tokens,
    most_said_by,
)
from .questions.prompting import Prompting
from .questions.prompts import question_field_read
from .report.report import JobSetup, RunOutcome, RunReport
from .watch.rates import expected_length
from .watch.startup_load import SinceStart
from .watch.tally import RecordCounts
from .watch.watch import RunWatch
from .words import counted

log = logging.getLogger("ggbatch")

__all__ = ["STREAMED", "EngineFactory", "open_backend", "run_job"]


def run_job(config: JobConfig, engine_factory: EngineFactory = LLAMA_ENGINE,
            progress: str = "auto", fresh: bool = False,
            use_tuned: bool = True, job_file: Optional[str] = None, window: int = WINDOW) -> RunReport:
    """Run a whole job and return its report (also written to config.report if set). Answers
    already in the output's journal from an earlier run of the same job are reused unless
    `fresh`. Raises GgbatchError subclasses; whatever ends a run that reached its workers, the
    answers file is written first (WorkerFailure, Interrupted). `window`: records made into
    questions at a time; a file of more streams. SIGINT and SIGTERM are the run's from its start
    (runner/pool/signals.py): a stop at any moment writes the answers file and raises Interrupted."""
    leave_if_importing_script()  # a script's unguarded ggbatch.run(), in a child importing it again
    with STOP.run(), _readable(config) as config, key_said_in_file(config):
        return _run(config, engine_factory, progress, fresh, use_tuned, job_file, window)


@contextmanager
def _readable(config: JobConfig) -> Iterator[JobConfig]:
    """The job, its questions readable as often as the run reads them: piped in, they are copied
    beside the output first (runner/files/piped.py) and named as given; a stop while they were
    copied ends the run before any is answered."""
    with readable_input(config.input, config.output, lambda: STOP.signum) as name:
        yield replace(config, input=name)


def _model(config: JobConfig) -> tuple[str, ModelIdentity]:
    """The model's file and identity; a refusal names the job file and key that gave the model."""
    with model_said_in_file(config):
        path = resolve_model(config.model)
        return path, identify(path)


def _run(config: JobConfig, engine_factory: EngineFactory, progress: str, fresh: bool,
         use_tuned: bool, job_file: Optional[str], window: int) -> RunReport:
    clock = {"start": time.perf_counter(), "started_at": time.time()}
    model_path, model = _model(config)
    paths = job_paths(config.input, model_path, config.output, config.report, job_file, config.errors_output)
    config = replace(config, output=paths.output, report=paths.report, errors_output=paths.errors_output)
    answer = job_answer(config)  # a bad schema or grammar: exit 2 before any worker starts
    since_start = SinceStart() if config.threads_adapt == "auto" else None  # the cores before any worker starts
    with _locked(config):
        reading = None if fresh else start_reading(paths.journal)  # while the input is read, the tokenizer starts
        first_records, rest, stream = _read(config, window)
        formats = _formats(config, stream.format)
        check_requests(config, first_records)
        with open_backend(config) as backend:
            started = start_layout(config, model, first_records, STREAMED if rest is not None else len(first_records),
                                   use_tuned, backend.nodes())
            with WorkerPool(worker_specs(started, model_path, engine_factory), backend=backend,
                            keep_answers=False, model=model) as pool:
                STOP.attach(pool)
                if first_records and not pool.stopping:
                    pool.start()  # the workers load the model while the questions are prepared
                with Prompting(config, model_path, answer) as prompting:
                    journal = _open_journal(paths, config, model, prompting, fresh, reading)
                    preparer = Preparer(config, prompting, journal)
                    with RunWatch(progress, clock["start"], since_start is not None, journal,
                                  since_start=since_start, on_memory=preparer.note.memory_known) as watch:
                        if config.choices != CHOICES_AUTO:  # lines answered before need not be parsed
                            stream.known.qids_of = journal.records_known
                        first = preparer.window(first_records, last=rest is None)
                        del first_records  # the records' fields were for rendering: a big file's largest part
                        if rest is None:
                            prompting.close()  # every question is made: the vocabulary's memory goes back
                        growth = _settle(config, started, preparer, first, stream.longest_line, model_path, journal)
                        pool.keep(growth.plan.node_of())
                        clock["prepared"] = time.perf_counter()
                        _start_run(watch, first, prompting, growth, pool, None if rest is None else streamed_total(
                            first, stream.records_guess, config.shard, journal.kept, len(preparer.made.from_journal)))
                        watch.progress.resumed(journal.kept)
                        ended = _answer(pool, first, growth.engines(), _feed(preparer, rest, window, watch, pool,
                                                                             growth), window, watch, journal.path)
                        preparer.say()
                        counts = _write_answers(config, preparer, journal, ended,
                                                _output_spec(config, preparer, formats[1], clock, stream.text_ids))
                        setup = _setup(config, model, preparer, growth, formats)
                    _say_cut(counts)
    if not isinstance(ended, ModelError):  # which wrote no answers file: no report either, an earlier one stays
        report = _report(setup, counts, pool, watch, clock)
    if ended is not None:
        raise ended
    return report


@contextmanager
def _locked(config: JobConfig) -> Iterator[None]:
    """The output's lock held; the copies a run killed while writing the answers left beside them
    are removed, now that nothing else writes them."""
    with OutputLock(config.output):
        for written in filter(None, (config.output, config.errors_output)):
            remove_stale_copies(written)
        yield


def _feed(preparer: Preparer, rest: Optional[Iterator[Record]], window: int, watch: RunWatch, pool: WorkerPool,
          growth: ContextGrowth) -> Optional[QuestionFeed]:
    """The windows after the first, made while the workers answer (None: there are none). As
    the pool takes each, the workers' context grows if its questions need more (runner/plan/growth.py)."""
    def taken(w: Window) -> None:
        watch.progress.grow(len(w.questions), last=w.last)
        engines = growth.engines_for(w.questions)
        if engines is not None:
            pool.reconfigure(engines)
            watch.progress.slots = growth.slots

    return None if rest is None else QuestionFeed(preparer, rest, window, taken)


def _start_run(watch: RunWatch, first: Window, prompting: Prompting, growth: ContextGrowth, pool: WorkerPool,
               expected: Optional[int]) -> None:
    """The watch starts on the first window's questions (`expected`: a streamed file's estimate of
    all of them)."""
    length = expected_length(max_tokens(first.questions, prompting.generation),
                             [lay.n_ctx_seq for lay in growth.plan.layouts])
    watch.start_run(len(first.questions), length, growth.slots, pool)
    if expected:
        watch.progress.expect(expected)


def streamed_total(first: Window, records_guess: int, shard: Optional[Shard], held: int, held_first: int) -> int:
    """About how many questions a streamed file holds to answer in this run: its records (about
    its lines; this shard's share of them) after the first window, less the answers the journal
    holds beyond it (`held` in all, `held_first` of them the first window's), as many of them
    distinct as of the first window's records to answer, and the first window's questions."""
    if not records_guess:
        return 0  # not counted (a JSON array is read whole)
    mine = records_guess / (shard.count if shard is not None else 1)
    to_answer_first = first.records - held_first
    distinct = len(first.questions) / to_answer_first if to_answer_first > 0 else 1.0
    rest = max(0.0, mine - first.records - (held - held_first))
    return len(first.questions) + round(rest * min(distinct, 1.0))


def _read(config: JobConfig, window: int) -> tuple[list[Record], Optional[Iterator[Record]], QuestionStream]:
    """The first window's records; an iterator over the rest if the file has more (it streams:
    None otherwise); the file as opened."""
    stream = open_question_file(config.input, config.id_field,
                                question_field_read(config.prompt_template, config.question_field), config.input_format)
    read = [0]  # records read, of every shard

    def mine() -> Iterator[Record]:
        for rec in stream.records:
            read[0] += 1
            if not stream.text_ids and not rec.integer_id(config.id_field):
                stream.text_ids = True  # another shard's too: every shard writes ids as one run of the file would
            if in_shard(rec.qid, config.shard):
                yield rec

    records = mine()
    first = list(itertools.islice(records, window + 1))
    rest = itertools.chain(first[window:], records) if len(first) > window else None
    first = first[:window]
    if config.shard is not None:
        counts = f"{len(first)} of {counted(read[0], 'question')}" if rest is None else "its questions, streamed"
        log.info("shard %s%s: %s, answers to %s", config.shard,
                 f" ({config.shard.source})" if config.shard.source else "", counts, config.output)
    return first, rest, stream


def _formats(config: JobConfig, input_fmt: str) -> tuple[str, str]:
    """(the questions' format, the answers file's). An id field that the answers rows would
    overwrite, in the answers file or the errors file, is refused here, before any worker starts."""
    fmt = output_format(config.output, config.output_format, input_fmt)
    errors = [errors_format(config.errors_output, fmt)] if config.errors_output else []
    check_id_column(config.id_field, [fmt, *errors])
    return input_fmt, fmt


def _open_journal(paths: JobPaths, config: JobConfig, model: ModelIdentity, prompting: Prompting, fresh: bool,
                  reading: "Optional[Future[Optional[Earlier]]]") -> Journal:
    """The journal, whose fingerprint needs the generation settings and the chat template."""
    journal = Journal(paths.journal, fingerprint(config, model, prompting.generation, prompting.template_sha), fresh,
                      reading)
    if journal.kept:
        log.info("resuming: %d answers in %s from an earlier run of this job", journal.kept, journal.path)
    return journal


def _settle(config: JobConfig, started: NodePlan, preparer: Preparer, first: Window, longest_line: int,
            model_path: str, journal: Journal) -> ContextGrowth:
    """The layout of the started workers, now that the first window's prompts are known (phase
    2, runner/launch.py settle). A streamed file's context also fits the longest line of the
    file, guessed from its bytes, and grows if a later window needs more (runner/plan/growth.py).
    Flash attention on auto runs as the journaled run ran it, when this run resumes one; a new
    journal is told what auto decided (runner/journal/ran.py)."""
    gen = preparer.generation
    samples = max_samples(first.questions, gen)  # each a sequence of its own once the prompt is in
    n_todo = (len(first.questions) if first.last else STREAMED) * samples
    guess = 0 if first.last else math.ceil(longest_line / layouts.CHARS_PER_TOKEN) + layouts.CHAT_TEMPLATE_TOKENS
    job_facts, prefix = facts(first, preparer, n_todo, guess)
    most = max_tokens(first.questions, gen)
    growth = settle(config, started, preparer.prompting, job_facts, prefix, most, model_path,
                    flash_attn=journal.ran("flash_attn"), most_said_by=most_said_by(first.questions, gen, most))
    journal.record_ran(growth.plan.ran_on_auto())
    if first.questions:  # a rerun that the journal answers whole has no sample to lay out
        check_sample_slots([lay.slots for lay in growth.plan.layouts], config.sampling.n, config)
    return growth


def _setup(config: JobConfig, model: ModelIdentity, preparer: Preparer, growth: ContextGrowth,
           formats: tuple[str, str]) -> JobSetup:
    """What the run was planned with, once the whole file is made: the layout the context grew
    to, how many records and unique prompts, and their settings."""
    made, prompting, plan = preparer.made, preparer.prompting, growth.plan
    nodes = [] if plan.nodes[0].node_id is None else node_report(plan, growth.memory)
    return JobSetup(config=config, model=model, layout=plan.whole(), memory=growth.memory[0],
                    generation=prompting.generation, chat_template=prompting.chat_template,
                    n_prefix=len(growth.prefix), records=len(preparer.maker.ids),
                    unique_prompts=made.unique + len(made.refused), formats=formats,
                    own_settings=dict(made.own_settings), gpu_offload=prompting.info.gpu_offload,
                    sharing=preparer.sharing if config.prefix_cache == "auto" else None,
                    kv_bytes_per_cell=prompting.dims.kv_bytes_per_cell, nodes=nodes)


def _answer(pool: WorkerPool, first: Window, engine: dict[int, EngineConfig], feed: Optional[QuestionFeed],
            window: int, watch: RunWatch, journal: str) -> Optional[Exception]:
    """What ended the run early, if anything (the answers so far are in the journal). A stop asked
    when nothing was left to answer ends the run as any stop does. A record the file reads on to
    that cannot be read, or made into a prompt, ends it with no answers file (the rest of the file
    cannot be listed), its error saying that the answers so far are kept."""
    try:
        if first.questions or feed is not None:
            pool.run(first.questions, engine, feed, feed_below=window // 2, events=watch)
        return Interrupted(STOP.signum) if STOP.signum else None
    except (WorkerFailure, Interrupted, JournalError, ModelError) as exc:
        if feed is not None:
            feed.read_rest()
        return exc
    except (InputError, ConfigError) as exc:  # a later window's record: a bad line, a template it fails
        kind = InputError if isinstance(exc, InputError) else ConfigError
        raise kind(f"{exc}; the answers so far are kept in the journal {journal}: fix what this names and run "
                   "the same command again, which answers only the rest") from None
    finally:
        watch.end(pool)
        STOP.detach()  # the pool is done: a signal from now on ends the run as it is written
        if feed is not None:
            feed.close()


def _say_cut(counts: RecordCounts) -> None:
    """Answers held to choices or a grammar (a JSON schema) that were cut before they were complete
    (by max_tokens, inside the thinking or in the answer, or by the context) failed; the log says
    how many, and the first in input order with its error, which says what ran out and what to raise."""
    if counts.first_cut is not None:
        log.warning("%d answer%s held to choices or a grammar %s cut before %s complete and failed (first: %s: %s)",
                    counts.cut, *_were(counts.cut), *counts.first_cut)
    if counts.first_cut_sample is not None:
        log.warning("%d sample%s held to choices or a grammar %s cut before %s complete and %s no answer "
                    "(null in the question's list; its other samples answered it; first: %s: %s)",
                    counts.cut_samples, *_were(counts.cut_samples), "have" if counts.cut_samples > 1 else "has",
                    *counts.first_cut_sample)


def _were(n: int) -> tuple[str, str, str]:
    """The words _say_cut's lines change with their count: a plural s, were / was, they were / it was."""
    return ("s", "were", "they were") if n > 1 else ("", "was", "it was")


def _output_spec(config: JobConfig, preparer: Preparer, fmt: str, clock: dict[str, float],
                 text_ids: bool) -> OutputSpec:
    """How the answers file is written. Its columns are planned from the job's settings and, as the
    header comes before any row, from what questions asked of their own (an OpenAI line's `n` or
    `logprobs`): a column no setting planned would be dropped from CSV. text_ids: a record has a text id."""
    made = preparer.made
    return OutputSpec(fmt, config.id_field, config.keep_thinking, preparer.prompting.model_name,
                      completions=made.completions, responses=made.responses, refused=made.refused,
                      started=clock["started_at"], choice_logprobs=config.choice_logprobs,
                      token_logprobs=config.token_logprobs is not None or bool(made.own_settings.get("token_logprobs")),
                      answer_norm=config.choice_scoring == LOGLIKELIHOOD,
                      samples=config.sampling.n > 1 or bool(made.own_settings.get("n")),
                      integer_ids=not text_ids)


def _write_answers(config: JobConfig, preparer: Preparer, journal: Journal, ended: Optional[Exception],
                   spec: OutputSpec) -> RecordCounts:
    """Whatever ended the run, the answers file holds every answer and says of each question
    left without one why (or errors_output does, when set). Rows are made as they are written,
    each answer read back from the journal; each is counted as it is written, so the report
    says what the file says. A run the journal ended that cannot write the answers either (no
    room for them) says the journal's error first, then the answers'. A model error (exit 2: no
    worker could load the model or make its context, or the model file changed) writes none,
    nor the report: an earlier answers file and report stay as they were, and the journal keeps
    what this run answered."""
    if isinstance(ended, ModelError):
        return RecordCounts()
    why = ("no answer came back" if ended is None else
           f"the run was stopped by signal {ended.signum} first" if isinstance(ended, Interrupted) else
           "the journal could not take more answers" if isinstance(ended, JournalError) else str(ended))
    made, counts = preparer.made, RecordCounts()

    def rows() -> Iterator[Row]:
        for qid, first in preparer.maker.ids.answered_as():
            rejected = made.rejected.get(qid)
            answer = rejected or journal.answer(first)
            counts.count(qid, answer,
                         from_journal=rejected is None and answer is not None and first in made.from_journal)
            yield Row(qid, answer, not_answered(why) if answer is None else answer.error)

    try:
        write_answers(config.output, rows(), spec, config.errors_output)
    except OutputError as exc:
        if isinstance(ended, JournalError):  # (a full disk) its line says what to do: make room, run again
            raise JournalError(f"{ended}; writing the answers failed too: {exc}") from None
        raise
    return counts


def _report(setup: JobSetup, counts: RecordCounts, pool: WorkerPool, watch: RunWatch,
            clock: dict[str, float]) -> RunReport:
    end = time.perf_counter()
    ready = pool.first_ready_at
    outcome = RunOutcome(watch.tally, counts, pool.worker_runs(), watch.monitor.summary(),
                         {"total_s": end - clock["start"], "prepare_s": clock["prepared"] - clock["start"],
                          "run_s": end - clock["prepared"],
                          "first_worker_ready_s": ready - clock["start"] if ready else None},
                         watch.timeline.as_report(), watch.thread_changes)
    report = RunReport(setup, outcome)
    if setup.config.report:
        write_atomic(setup.config.report, json.dumps(report.as_json(), indent=2) + "\n", REPORT)
    return report
