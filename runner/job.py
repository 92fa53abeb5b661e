"""One job from start to finish, told in order by run_job: check the files and the model, start
the workers, prepare the questions while they load, reuse what the journal holds, settle the
layout, answer the rest, write the answers and the report.

    question file (runner/inputs.py, runner/formats) ─▶ records (of one shard: runner/shards.py)
    records ─▶ prepare (runner/prepare.py) ─▶ journal.split ─▶ layout.settle ─▶ WorkerPool.run
    (the layout per node: this machine, or each Ray node with --backend ray; runner/nodes.py)
                                                                                     │
    answers file ◀── rows in input order (duplicates fanned out) ◀── answers by qid ◀┘
    (its format: runner/formats; without an answer, to errors_output when set)
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any, Callable, Optional

import psutil

from . import gpu
from . import layout as layouts
from . import tuned
from .answer_spec import job_answer
from .config import JobConfig
from .errors import Interrupted, WorkerFailure
from .formats.detect import output_format
from .formats.rows import OutputSpec
from .inputs import Record, read_question_file
from .journal import Journal, fingerprint
from .local_workers import LocalBackend
from .lock import OutputLock
from .model import ModelIdentity, identify, resolve_model
from .nodes import Node, NodePlan, node_report, share
from .outputs import answer_rows, write_answers, write_atomic
from .paths import JobPaths, job_paths
from .pool import WorkerPool
from .prepare import PreparedJob, prepare
from .report import JobSetup, RunOutcome, RunReport
from .shards import shard_records
from .signals import stop_on_signals
from .watch import RunWatch
from ..workers.protocol import Answer, EngineConfig, FinishReason, GenerationParams, WorkerSpec

log = logging.getLogger("ggbatch")

EngineFactory = Callable[[EngineConfig, int], Any]


def run_job(config: JobConfig, engine_factory: Optional[EngineFactory] = None,
            progress: str = "auto", fresh: bool = False,
            use_tuned: bool = True, job_file: Optional[str] = None) -> RunReport:
    """Run a whole job and return its report (also written to config.report if set). Answers
    already in the output's journal from an earlier run of the same job are reused unless
    `fresh`. Raises GgbatchError subclasses; whatever ends a run that reached its workers, the
    answers file is written first (WorkerFailure, Interrupted)."""
    clock = {"start": time.perf_counter(), "started_at": time.time()}
    model_path = resolve_model(config.model)
    paths = job_paths(config.input, model_path, config.output, config.report, job_file, config.errors_output)
    config = replace(config, output=paths.output, report=paths.report, errors_output=paths.errors_output)
    model = identify(model_path)
    answer = job_answer(config)  # a bad schema or grammar: exit 2 before any worker starts
    with OutputLock(config.output):
        records, formats = _read(config)
        with open_backend(config) as backend:
            started = _start_layout(config, model, records, use_tuned, backend.nodes())
            with RunWatch(progress, clock["start"], config.threads_adapt == "auto") as watch, WorkerPool(
                    _specs(started, model_path, engine_factory), watch.on_answers, watch.tick,
                    backend=backend, on_threads=watch.on_threads) as pool:
                if records:
                    pool.start()  # the workers load the model while the questions are prepared
                job = prepare(config, model_path, records, answer)
                del records  # the records' fields were for rendering: a big file's largest part
                todo, reused = _open_journal(watch, paths, config, model, job, fresh)
                setup, settled = _settle(config, model, started, job, len(todo), formats)
                pool.keep(settled.node_of())
                clock["prepared"] = time.perf_counter()
                watch.start_run(len(todo), job.max_tokens, sum(lay.workers * lay.slots for lay in settled.layouts),
                                pool)
                answers, ended = _answer(pool, todo, _engines(model_path, settled, job))
        _say_cut(job, answers)
        _write_answers(config, job, {**reused, **answers, **job.rejected}, ended,
                       _output_spec(config, job, formats[1], clock["started_at"]))
    report = _report(setup, answers, len(reused), list(job.rejected.values()), pool, watch, clock)
    if ended is not None:
        raise ended
    return report


def _read(config: JobConfig) -> tuple[list[Record], tuple[str, str]]:
    """The records, and the formats of the question file and of the answers file."""
    questions = read_question_file(config.input, config.id_field, config.question_field, config.input_format)
    records = shard_records(questions.records, config.shard)
    if config.shard is not None:
        log.info("shard %s%s: %d of the %d questions, answers to %s", config.shard,
                 f" ({config.shard.source})" if config.shard.source else "", len(records), len(questions.records),
                 config.output)
    return records, (questions.format, output_format(config.output, config.output_format, questions.format))


def open_backend(config: JobConfig) -> Any:
    """Where the workers live: local processes, or Ray actors (connecting here: a bad address is
    one line and exit 2 before any work)."""
    if config.backend == "ray":
        from .ray_workers import RayBackend

        return RayBackend(config.ray_address)
    return LocalBackend()


def _start_layout(config: JobConfig, model: ModelIdentity, records: list[Record], use_tuned: bool,
                  nodes: list[Node]) -> NodePlan:
    """The workers to start before the questions are tokenized (runner/layout.py, phase 1), on
    each node from its own cores."""
    n_gpu_layers = gpu.gpu_layers_for(config.n_gpu_layers, config.devices)
    # `ggbatch tune` measured CPU layouts of this machine: a job putting layers on a GPU, or
    # running on a Ray cluster's nodes, plans its own.
    local = len(nodes) == 1 and nodes[0].node_id is None
    choice = tuned.for_job(config, model, records) if use_tuned and local and not n_gpu_layers else None
    layouts_ = [layouts.start(node.cores, config.workers, config.threads, config.slots, config.repack,
                              share(len(records), node, nodes), layouts.cpu_flags(), choice, config.devices,
                              n_gpu_layers, config.batch_invariant) for node in nodes]
    if not local:
        log.info("backend ray: %s", "; ".join(f"{node.describe()}: {lay.workers} × {lay.threads} threads"
                                              for node, lay in zip(nodes, layouts_)))
    return NodePlan.of(nodes, layouts_)


def _specs(plan: NodePlan, model_path: str, engine_factory: Optional[EngineFactory]) -> list[WorkerSpec]:
    return [WorkerSpec(first + i, cores, model_path, engine_factory, lay.repack, n_gpu_layers=lay.n_gpu_layers,
                       device=lay.devices[i] if lay.devices else None, node_id=node.node_id, node_ip=node.ip or None)
            for node, lay, first in zip(plan.nodes, plan.layouts, plan.first_ids)
            for i, cores in enumerate(lay.cores)]


def _open_journal(watch: RunWatch, paths: JobPaths, config: JobConfig, model: ModelIdentity, job: PreparedJob,
                  fresh: bool) -> tuple[list, dict[str, Answer]]:
    """(questions to answer, answers reused from an earlier run of this job)."""
    journal = watch.journal = Journal(paths.journal, fingerprint(config, model, job.generation, job.template_sha),
                                      fresh)
    todo, reused = journal.split(job.questions)
    if reused:
        log.info("resuming: %d answers from %s, %d questions to answer", len(reused), journal.path, len(todo))
    return todo, reused


def _settle(config: JobConfig, model: ModelIdentity, started: NodePlan, job: PreparedJob, n_todo: int,
            formats: tuple[str, str]) -> tuple[JobSetup, NodePlan]:
    """The layout of the started workers, now that the prompts are known (phase 2), node by node
    on each node's memory, and with it everything the run was planned with. The context fits the
    largest max_tokens of any question."""
    if started.layouts[0].n_gpu_layers and not job.gpu_offload:
        log.warning("%s", gpu.offload_warning(started.layouts[0].n_gpu_layers))
    settled = [layouts.settle(lay, job.facts(share(n_todo, node, started.nodes)), config.slots, config.n_ctx,
                              job.max_tokens, config.n_batch,
                              psutil.virtual_memory().available if node.memory is None else node.memory,
                              offload=job.gpu_offload, cores=node.cores)
               for node, lay in zip(started.nodes, started.layouts)]
    plan = replace(started, layouts=tuple(lay for lay, _ in settled))
    nodes = [] if started.nodes[0].node_id is None else node_report(plan, [memory for _, memory in settled])
    return JobSetup(config, model, plan.whole(), settled[0][1], job.generation, job.chat_template,
                    len(job.prefix), len(job.ids), len(job.questions) + len(job.rejected), formats,
                    job.own_settings, job.gpu_offload, sharing=job.sharing,
                    kv_bytes_per_cell=job.dims.kv_bytes_per_cell, nodes=nodes), plan


def _engines(model_path: str, plan: NodePlan, job: PreparedJob) -> dict[int, EngineConfig]:
    """Each worker's engine, from its node's layout."""
    per_node = [layouts.engine_config(model_path, lay, job.prefix, job.generation) for lay in plan.layouts]
    return {wid: per_node[k] for wid, k in plan.node_of().items()}


def _answer(pool: WorkerPool, todo: list,
            engine: dict[int, EngineConfig]) -> tuple[dict[str, Answer], Optional[Exception]]:
    """Answers of this run, and what ended it early, if anything (the answers so far are kept)."""
    if not todo:
        return {}, None
    try:
        with stop_on_signals(pool):
            return pool.run(todo, engine), None
    except (WorkerFailure, Interrupted) as exc:
        return dict(pool.answers), exc


def _say_cut(job: PreparedJob, answers: dict[str, Answer]) -> None:
    """Answers under a grammar (a JSON schema) that max_tokens cut before the grammar was complete
    do not parse: their finish_reason is length; the log says how many."""
    own = {q.qid: q.generation for q in job.questions if q.generation is not None}
    cut = [qid for qid, a in answers.items() if a.finish_reason is FinishReason.LENGTH
           and _has_grammar(own.get(qid) or job.generation)]
    if cut:
        log.warning("%d answer%s under a grammar or JSON schema reached max_tokens before the grammar was complete "
                    "(finish_reason length; first: %s): such an answer is cut and may not parse, raise max_tokens",
                    len(cut), "s" if len(cut) > 1 else "", cut[0])


def _has_grammar(gen: GenerationParams) -> bool:
    return gen.answer is not None and (gen.answer.grammar is not None or bool(gen.answer.choices))


def _output_spec(config: JobConfig, job: PreparedJob, fmt: str, started_at: float) -> OutputSpec:
    return OutputSpec(fmt, config.id_field, config.keep_thinking, job.model_name, job.completions, job.refused,
                      started_at)


def _write_answers(config: JobConfig, job: PreparedJob, answers: dict[str, Answer],
                   ended: Optional[Exception], spec: OutputSpec) -> None:
    """Whatever ended the run, the answers file holds every answer and says of each question
    left without one why (or errors_output does, when set)."""
    why = ("no answer came back" if ended is None else
           f"the run was stopped by signal {ended.signum} first" if isinstance(ended, Interrupted) else str(ended))
    rows = answer_rows(job.ids, answers, job.aliases, unanswered=f"not answered: {why}")
    write_answers(config.output, rows, spec, config.errors_output)


def _report(setup: JobSetup, answers: dict[str, Answer], reused: int, rejected: list[Answer], pool: WorkerPool,
            watch: RunWatch, clock: dict[str, float]) -> RunReport:
    end = time.perf_counter()
    ready = pool.first_ready_at
    outcome = RunOutcome(answers, reused, rejected, pool.worker_runs(), watch.monitor.summary(),
                         {"total_s": end - clock["start"], "prepare_s": clock["prepared"] - clock["start"],
                          "run_s": end - clock["prepared"],
                          "first_worker_ready_s": ready - clock["start"] if ready else None},
                         watch.timeline.as_report(), watch.thread_changes)
    report = RunReport(setup, outcome)
    if setup.config.report:
        write_atomic(setup.config.report, json.dumps(report.as_json(), indent=2) + "\n")
    return report
