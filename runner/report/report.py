"""The run report: enough to judge the run and to reproduce it.

A RunReport is built from what was planned (JobSetup: config, model, layout, memory plan) and
what happened (RunOutcome: the answers counted, what each worker did as the pool saw it, what the monitor
measured, the timings). `as_json()` is its serialisation, the report file's schema; callers in
Python read its fields.
"""

from __future__ import annotations

import json
import math
import resource
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from ...workers.engine.memory_kind import MemoryKind
from ...workers.protocol import RESPONSE_FORMAT_ENFORCED, GenerationParams
from ..config.schema import FIRST_TOKEN, JobConfig
from ..model.identity import ModelIdentity
from ..model.versions import package_version
from ..plan.gpu import gpu_layers_text
from ..plan.layout import Layout
from ..plan.memory import MemoryPlan
from ..pool.worker_run import WorkerRun
from ..questions.prefix_groups import Sharing
from ..watch.monitor import UsageSummary
from ..watch.tally import AnswerTally, RecordCounts
from ..words import counted, layout_words


def percentiles(values: Iterable[float], most: Optional[float] = None) -> dict[str, Optional[float]]:
    """p50 / p95 / max (nearest-rank), rounded to milliseconds; None with nothing timed (every
    answer failed, or came from the journal): 0.00 s would read as instant answers. `most`: the
    max, where the values are a sample of the timings (runner/watch/reservoir.py)."""
    s = sorted(values)
    if not s:
        return {"p50": None, "p95": None, "max": None}
    def pick(q: float) -> float:
        # the ceil(q*n)-th smallest; round(q*n + 0.5) was one rank high where q*n is odd (round()
        # rounds halves to even): p50 of 2 answers was the slower, p95 of 20 the max
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
    return {"p50": round(pick(0.50), 3), "p95": round(pick(0.95), 3), "max": round(s[-1] if most is None else most, 3)}


def own_peak_rss_mib() -> float:
    """The coordinator's peak resident memory: Linux's VmHWM, which starts afresh with the
    process's own address space (getrusage's ru_maxrss is kept across exec, so a process started
    by a big one would report its parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def own_cpu_s() -> float:
    """CPU time of the coordinator itself: on a machine where every core runs a worker thread,
    each second of it is taken from llama.cpp."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True, kw_only=True)
class JobSetup:
    """What was planned."""

    config: JobConfig
    model: ModelIdentity
    layout: Layout
    memory: MemoryPlan
    generation: GenerationParams
    chat_template: str  # "model", "plain" or "job"
    n_prefix: int  # shared prefix tokens
    records: int
    unique_prompts: int
    formats: tuple[str, str] = ("json", "json")  # of the question file and of the answers file
    own_settings: dict[str, int] = field(default_factory=dict)  # questions with settings of their own
    gpu_offload: bool = False  # this llama.cpp build can offload layers to a GPU
    sharing: Optional[Sharing] = None  # the prefix cache's groups (None: prefix_cache off)
    kv_bytes_per_cell: int = 0
    nodes: Sequence[Mapping[str, Any]] = ()  # the Ray backend: each node's layout (runner/plan/nodes.py node_report)


@dataclass(frozen=True)
class RunOutcome:
    """What happened."""

    tally: AnswerTally  # the answers of this run, counted by prompt (and those refused before any worker saw them)
    records: RecordCounts  # every record of the input by its row in the answers file
    workers: Sequence[WorkerRun]
    usage: UsageSummary
    timings: Mapping[str, Optional[float]]  # total_s, prepare_s, run_s, first_worker_ready_s
    timeline: Sequence[Mapping[str, Any]] = ()  # runner/watch/timeline.py Timeline.as_report()
    # llama.cpp thread count changes under contention (runner/watch/thread_controller.py), as the workers made
    # them: {t_s, worker, from, to, reason}
    thread_changes: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class RunReport:
    setup: JobSetup
    outcome: RunOutcome
    versions: dict[str, str] = field(default_factory=lambda: {
        "ggbatch": package_version("ggbatch"), "llama_cpp_python": package_version("llama_cpp_python")})
    coordinator_cpu_s: float = field(default_factory=own_cpu_s)

    @property
    def failed(self) -> int:
        """Records whose row holds an error."""
        return self.outcome.records.failed

    @property
    def answered(self) -> int:
        """Records whose row holds an answer, made in this run or taken from the journal."""
        return self.outcome.records.answered

    @property
    def not_answered(self) -> int:
        """Records whose row says why it has no answer (a run that ended early)."""
        return self.outcome.records.not_answered

    def as_json(self) -> dict[str, Any]:
        """The report file: the schema users' tooling reads."""
        return {"ggbatch_version": self.versions["ggbatch"],
                "llama_cpp_python_version": self.versions["llama_cpp_python"],
                "model": self.setup.model.as_report(), "layout": self._layout(),
                "generation": self._generation(), "questions": self._questions(),
                "errors": [{"questionID": qid, "error": error} for qid, error in self.outcome.records.errors],
                **self._throughput(), "timings_s": self._timings(),
                "workers": {str(w.worker_id): self._worker(w) for w in self.outcome.workers},
                "prefix_cache": self._prefix_cache(), "memory": self._memory(), "threads": self._threads(),
                "timeline": list(self.outcome.timeline)}

    def _layout(self) -> dict[str, Any]:
        lay, config = self.setup.layout, self.setup.config
        return {"workers": lay.workers, "threads_per_worker": lay.threads, "slots_per_worker": lay.slots,
                "cores": [list(c) for c in lay.cores], "n_ctx_per_sequence": lay.n_ctx_seq,
                "batch_invariant": config.batch_invariant, "kv": "unified" if lay.kv_unified else "per-sequence",
                "shared_prefix_tokens": self.setup.n_prefix, "repack_weights": lay.repack,
                "repack_reason": lay.repack_reason, "n_batch": lay.n_batch, "flash_attn": bool(lay.flash_attn),
                "n_gpu_layers": gpu_layers_text(lay.n_gpu_layers), "devices": list(lay.devices),
                "gpu_offload": self.setup.gpu_offload, "backend": config.backend,
                **({"nodes": [dict(n) for n in self.setup.nodes]} if self.setup.nodes else {})}

    def _generation(self) -> dict[str, Any]:
        config, gen = self.setup.config, self.setup.generation
        own = self.setup.own_settings
        return {"max_tokens": gen.max_tokens, "stop": list(gen.stop), "ignore_eos": gen.ignore_eos,
                "chat_template": self.setup.chat_template, "system": config.system,
                "sampling": asdict(gen.sampling),
                "own_settings": {**own, "response_format_enforced": RESPONSE_FORMAT_ENFORCED} if own else {},
                "answer": _answer_shape(config)}

    def _questions(self) -> dict[str, Any]:
        """Every count but unique_prompts is of records (lines of the input, duplicates included):
        answered + failed + not_answered = records; from_journal and finish_reasons count the
        same records, whichever run made their answer."""
        shard, counts = self.setup.config.shard, self.outcome.records
        return {"records": self.setup.records, "unique_prompts": self.setup.unique_prompts,
                "shard": {"index": shard.index, "count": shard.count} if shard is not None else None,
                "input_format": self.setup.formats[0], "output_format": self.setup.formats[1],
                "answered": counts.answered, "failed": counts.failed, "not_answered": counts.not_answered,
                "from_journal": counts.from_journal,
                "finish_reasons": dict(sorted(counts.finish_reasons.items()))}

    def _throughput(self) -> dict[str, Any]:
        """Tokens, rates, latency and occupancy of the answers made in this run (reused ones
        took no time here). `prompt` is the prompt tokens in the questions answered (a question
        refused before its prompt went through the model, too long for the context, has its
        tokens in prompt_refused); `prompt_computed` those the engines decoded, as the progress
        line and the timeline count them: a shared prefix once per worker, a prefix the cache
        held or a sample's copied prompt not at all, a choice's forked sequence again."""
        tally = self.outcome.tally
        run_s = self.outcome.timings.get("run_s") or 1e-9
        prompt, generated = tally.prompt_tokens, tally.generated_tokens
        computed = self._engines_total("prompt_computed")
        busy = self._engines_total("busy_slots", whole=False)
        steps = self._engines_total("steps", whole=False)
        return {"tokens": {"prompt": prompt, "generated": generated, "prompt_per_s": round(prompt / run_s, 2),
                           "prompt_computed": computed, "prompt_computed_per_s": round(computed / run_s, 2),
                           "generated_per_s": round(generated / run_s, 2), "prompt_refused": tally.refused_tokens},
                "latency_s": percentiles(tally.latency_s, tally.latency_s.most),
                "ttft_s": percentiles(tally.ttft_s, tally.ttft_s.most),
                "mean_slot_occupancy": round(busy / (steps * self.setup.layout.slots), 3) if steps else None}

    def _engines_total(self, key: str, whole: bool = True) -> Any:
        """A counter of the workers' engines summed (every life of each worker, as far as each sent
        its counters before it ended); whole: as an int."""
        total = sum(w.engine.get(key, 0.0) for w in self.outcome.workers)
        return int(total) if whole else total

    def _prefix_cache(self) -> dict[str, Any]:
        """Prompt tokens computed against those in the questions answered here, and what the cache held."""
        engines = [w.engine for w in self.outcome.workers]
        total = self._engines_total
        in_questions = self.outcome.tally.prompt_tokens
        computed = total("prompt_computed")
        sharing = self.setup.sharing
        kept = max((int(e.get("kept_tokens_peak", 0.0)) for e in engines), default=0)
        memory = self._model_memory()
        return {"mode": self.setup.config.prefix_cache,
                "active": self.setup.layout.prefix_cache and memory.prefix_cache,
                "model_memory": memory.value, "memory_note": memory.note() or None,
                "groups": sharing.groups if sharing else 0, "grouped_questions": sharing.grouped if sharing else 0,
                "shareable_tokens": sharing.shareable if sharing else 0,
                "prompt_tokens": in_questions, "prompt_tokens_computed": computed,
                "computed_share": round(computed / in_questions, 3) if in_questions else None,
                "hits": total("prefix_hits"), "stream_copies": total("stream_copies"),
                # samples (sampling.n) started from a copy of their question's prompt KV
                "sample_forks": total("sample_forks"),
                "kept_tokens_peak": kept, "kept_mib_peak": round(kept * self.setup.kv_bytes_per_cell / 2**20, 1)}

    def _model_memory(self) -> MemoryKind:
        """The model's memory as the workers' engines found it (attention when none got that far)."""
        found = [w.memory for w in self.outcome.workers if w.memory]
        return MemoryKind(found[0]) if found else MemoryKind.ATTENTION

    def _timings(self) -> dict[str, Any]:
        return {**{k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.outcome.timings.items()},
                "coordinator_cpu_s": round(self.coordinator_cpu_s, 3)}

    def _worker(self, w: WorkerRun) -> dict[str, Any]:
        return {"cores": list(w.cores), **self.outcome.tally.of_worker(w.worker_id), "restarts": w.restarts,
                "contexts": w.contexts, "memory": w.memory,
                "load_s": round(w.load_s, 3) if w.load_s is not None else None, "llama_n_threads": w.n_threads,
                "device": w.device, "n_gpu_layers": gpu_layers_text(w.n_gpu_layers), "gpu_layers": w.gpu_layers,
                **({"node": dict(w.node)} if w.node else {}),
                **self.outcome.usage.workers.get(w.worker_id, {}),
                "engine": {k: round(v, 4) for k, v in w.engine.items()}}

    def _threads(self) -> dict[str, Any]:
        return {"adapt": self.setup.config.threads_adapt, "changes": [dict(c) for c in self.outcome.thread_changes]}

    def _memory(self) -> dict[str, Any]:
        usage = self.outcome.usage
        return {"plan": self.setup.memory.as_report(),
                "measured_peak_pss_mib": round(sum(u.get("peak_pss_mib", 0) for u in usage.workers.values()), 1),
                "mean_core_utilisation_percent": usage.mean_core_utilisation_percent,
                "peak_system_used_mib": usage.peak_system_used_mib,
                # the coordinator's own (its workers and tokenizer are processes of their own)
                "coordinator_peak_rss_mib": own_peak_rss_mib(),
                "min_system_available_mib": usage.min_system_available_mib,
                "cgroup_limit_mib": usage.cgroup_limit_mib}


def _gpu_summary(report: RunReport) -> str:
    lay = report.setup.layout
    if not lay.n_gpu_layers:
        return ""
    where = (f" on GPU{'s' if len(lay.devices) > 1 else ''} {','.join(map(str, lay.devices))}"
             if lay.devices else "")
    return (f", {gpu_layers_text(lay.n_gpu_layers)} layers asked for the GPU{where}"
            + ("" if report.setup.gpu_offload else " (none offloaded: this llama.cpp build has no GPU offload)"))


def _cache_summary(cache: dict[str, Any]) -> str:
    """The share of the questions' prompt tokens computed: always with the prefix cache, and
    without it where they are more (choices of several tokens each compute their prompt then)."""
    share = cache["computed_share"]
    if cache["active"]:
        return (f"; {100 * (share or 0):.0f}% of the questions' prompt tokens computed "
                f"(prefix cache, {cache['hits']} hits)")
    if share is not None and share > 1.0:
        return f"; {100 * share:.0f}% of the questions' prompt tokens computed (prefix cache off)"
    return ""


def _threads_summary(changes: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per worker whose llama.cpp threads changed: when, from and to."""
    by_worker: dict[int, list[str]] = {}
    for c in changes:
        by_worker.setdefault(c["worker"], []).append(f"{c['from']} → {c['to']} at {c['t_s']:.0f} s")
    return [f"threads    worker {wid}: {', '.join(moves)} (other processes on its cores; the report's threads "
            "says why)" for wid, moves in sorted(by_worker.items())]


def format_written(report: RunReport, output: str, errors_output: Optional[str]) -> str:
    """Where the rows went, counted as rows: a row without an answer (failed, or not answered in a
    run that ended early) is not an answer, so a run whose every question failed wrote rows and no
    answers. With errors_output those rows are that file's."""
    rows, answered = report.setup.records, report.answered
    if errors_output is not None:
        return (f"wrote {counted(answered, 'answer')} to {output}, {counted(rows - answered, 'row')} without one "
                f"to {errors_output}")
    if answered == rows:
        return f"wrote {counted(rows, 'answer')} to {output}"
    without = ", ".join(f"{n} {what}" for n, what in ((report.failed, "failed"), (report.not_answered, "not answered"))
                        if n)
    return f"wrote {counted(rows, 'row')} to {output} ({answered} answered, {without})"


def format_summary(report: RunReport) -> str:
    """The short table printed at the end of a run."""
    data = report.as_json()
    q, t, lay, timings = data["questions"], data["tokens"], report.setup.layout, data["timings_s"]
    lines = [
        f"answered   {q['answered']}/{q['records']} records"
        + (f", {q['failed']} failed" if q["failed"] else "")
        + (f", {q['not_answered']} not answered" if q["not_answered"] else "")
        + (f", {q['from_journal']} from the journal" if q["from_journal"] else "")
        + (f" ({q['unique_prompts']} unique prompts)" if q["records"] != q["unique_prompts"] else ""),
        f"layout     {layout_words(lay.workers, lay.threads, lay.slots)}, {lay.n_ctx_seq} ctx/seq, "
        f"{report.setup.n_prefix} shared prefix tokens, "
        f"{'unified' if lay.kv_unified else 'per-sequence'} KV, flash attention {'on' if lay.flash_attn else 'off'}, "
        f"weights {'repacked' if lay.repack else 'not repacked'} ({lay.repack_reason})" + _gpu_summary(report),
        f"wall time  {timings['total_s']:.2f} s (prepare {timings['prepare_s']:.2f} s)",
        f"tokens     {t['prompt']} prompt in the questions answered ({t['prompt_per_s']:.1f}/s), "
        f"{t['prompt_computed']} prompt computed ({t['prompt_computed_per_s']:.1f}/s), "
        f"{t['generated']} generated ({t['generated_per_s']:.1f}/s)"
        + (f", {t['prompt_refused']} prompt tokens refused (not decoded)" if t["prompt_refused"] else "")
        + _cache_summary(data["prefix_cache"]),
        _latency_summary(data["latency_s"]),
    ]
    lines += _threads_summary(data["threads"]["changes"])
    for wid, w in data["workers"].items():
        where = f"node {w['node']['ip']} ({w['node']['node_id'][:12]}), " if "node" in w else ""
        lines.append(f"worker {wid}   {where}cores {w['cores']}, {counted(w['questions'], 'question')}, "
                     f"{_usage_summary(w)}")
    return "\n".join(lines)


def _usage_summary(worker: Mapping[str, Any]) -> str:
    """A worker's CPU and memory, as the coordinator's monitor measured them: psutil sees only this
    machine's processes, so a worker on another Ray node has none (not zeros)."""
    if "mean_cpu_percent" not in worker:
        return "CPU and memory not measured (the monitor sees this machine's processes only)" if "node" in worker else \
            "CPU and memory not measured"
    return f"{worker['mean_cpu_percent']:.0f}% CPU, peak PSS {worker['peak_pss_mib']:.0f} MiB"


def _latency_summary(latency: Mapping[str, Optional[float]]) -> str:
    if latency["max"] is None:
        return "latency    n/a (no answer of this run was timed: each failed, or came from the journal)"
    return f"latency    p50 {latency['p50']:.2f} s, p95 {latency['p95']:.2f} s, max {latency['max']:.2f} s"


def _answer_shape(config: JobConfig) -> Optional[dict[str, Any]]:
    """What the job held every answer to (answer.*), or None: free text."""
    if config.token_logprobs is not None:
        return {"token_logprobs": config.token_logprobs, **(_held_to(config) or {})}
    return _held_to(config)


def _held_to(config: JobConfig) -> Optional[dict[str, Any]]:
    if config.choices:
        return {"choices": config.choices if isinstance(config.choices, str) else list(config.choices),
                "logprobs": config.choice_logprobs, "choice_logits": config.choice_logits,
                **({"choice_scoring": config.choice_scoring} if config.choice_scoring != FIRST_TOKEN else {})}
    if config.json_schema is not None:
        return {"json_schema": json.loads(config.json_schema)}
    return {"grammar": config.grammar} if config.grammar is not None else None
