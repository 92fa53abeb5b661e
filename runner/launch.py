"""What a job (runner/job.py) and a warm pool (runner/warm/pool.py) start alike: where the workers
live (the backend), how many and on which cores before the prompts are known (phase 1 of
runner/plan/layout.py), what each worker is started with, and the plan settled on the prompts
(phase 2), kept to grow the context when later questions need more (runner/plan/growth.py).

    config ─▶ open_backend ─▶ start_layout (nodes' cores, tuned layouts) ─▶ worker_specs ─▶ WorkerPool
    prompt facts (from the tokenizer) ─▶ settle ─▶ ContextGrowth: the engines, each worker's
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import replace
from typing import Any, Optional

from ..workers.engine.interface import EngineFactory
from ..workers.spec import WorkerSpec
from .config.schema import JobConfig, said_in_files
from .errors import KeysError
from .files.inputs import Record
from .model.identity import ModelIdentity
from .plan import gpu, tuned
from .plan import layout as layouts
from .plan.cgroup_memory import system_memory
from .plan.growth import ContextGrowth, PlanInputs
from .plan.layout import PromptFacts
from .plan.nodes import Node, NodePlan, share
from .plan.repack import cpu_flags, model_is_hybrid
from .plan.repack_check import repack_refused
from .plan.repack_share import nothing_to_repack
from .pool.backend import Backend
from .pool.gpu_probe import free_gpu_memory
from .pool.local import LocalBackend
from .questions.prompting import Prompting

log = logging.getLogger("ggbatch")

STREAMED = 1 << 20  # questions a streamed file (or a warm pool) is planned for: more than any layout gives slots to


def open_backend(config: JobConfig) -> Backend[Any]:
    """Where the workers live: local processes, or Ray actors (connecting here: a bad address is
    one line and exit 2 before any work)."""
    if config.backend == "ray":
        from .pool.ray import RayBackend

        return RayBackend(config.ray_address)
    return LocalBackend()


def start_layout(config: JobConfig, model: ModelIdentity, records: list[Record], n_records: int,
                 use_tuned: bool, nodes: list[Node]) -> NodePlan:
    """The workers to start before the questions are tokenized (runner/plan/layout.py, phase 1), on
    each node from its own cores, for n_records questions (STREAMED: many, not known yet)."""
    n_gpu_layers = gpu.gpu_layers_for(config.n_gpu_layers, config.devices)
    # `ggbatch tune` measured CPU layouts of this machine: a job putting layers on a GPU, or
    # running on a Ray cluster's nodes, plans its own.
    local = len(nodes) == 1 and nodes[0].node_id is None
    if local and n_gpu_layers:  # the VRAM the GPUs have free, before the workers take theirs
        nodes = [replace(nodes[0], gpus=free_gpu_memory())]
    choice = tuned.for_job(config, model, records) if use_tuned and local and not n_gpu_layers else None
    hybrid, plain = model_is_hybrid(model.path), nothing_to_repack(model.path, cpu_flags())
    refused = repack_refused(config.repack is False or config.batch_invariant or hybrid or plain)
    try:
        layouts_ = [replace(layouts.start(node.cores, workers=config.workers, threads=config.threads,
                                          slots=config.slots, repack=config.repack,
                                          n_records=share(n_records, node, nodes), flags=cpu_flags(), tuned=choice,
                                          devices=config.devices, n_gpu_layers=n_gpu_layers,
                                          batch_invariant=config.batch_invariant, hybrid=hybrid,
                                          repack_refused=refused, nothing_to_repack=plain,
                                          where="here" if local else f"on {node.describe()}"),
                              flash_attn=config.flash_attn)
                    for node in nodes]
    except KeysError as exc:  # workers or threads past the cores: named after the job file that set them
        raise said_in_files(config, exc) from None
    if not local:
        log.info("backend ray: %s", "; ".join(f"{node.describe()}: {lay.workers} × {lay.threads} threads"
                                              for node, lay in zip(nodes, layouts_)))
    return NodePlan.of(nodes, layouts_)


def worker_specs(plan: NodePlan, model_path: str, engine_factory: EngineFactory) -> list[WorkerSpec]:
    """What each planned worker is started with (engine_factory: llama.cpp's, or the tests' fake engine)."""
    return [WorkerSpec(first + i, cores, model_path, engine_factory=engine_factory, repack=lay.repack,
                       n_gpu_layers=lay.n_gpu_layers, device=lay.devices[i] if lay.devices else None,
                       node_id=node.node_id, node_ip=node.ip or None)
            for node, lay, first in zip(plan.nodes, plan.layouts, plan.first_ids)
            for i, cores in enumerate(lay.cores)]


def settle(config: JobConfig, started: NodePlan, prompting: Prompting, facts: PromptFacts, prefix: array[int],
           most_tokens: int, model_path: str, *, flash_attn: Optional[bool] = None,
           first_slots: Optional[int] = None, most_said_by: Optional[str] = "max_tokens") -> ContextGrowth:
    """The layout of the started workers, now that the prompts are known (phase 2), node by node
    on each node's memory. The context fits the largest max_tokens of any question (most_tokens)
    and facts.longest; it grows later if questions need more (runner/plan/growth.py), keeping the
    flash attention decided here: `flash_attn` (what a resumed journal's run ran) when given.
    `first_slots`: auto slots start at most this many a worker, and grow to the cap with the load.
    `most_said_by`: where most_tokens was given, for the warning of a max_tokens past the context
    (None: nowhere the user sees, as a pool whose questions bring their own: no warning)."""
    if flash_attn is not None:
        started = started.with_flash_attn([flash_attn] * len(started.layouts))
    caps_later: list[int] = []
    if first_slots is not None and config.slots is None:
        caps_later = [lay.slot_cap for lay in started.layouts]
        started = replace(started, layouts=tuple(replace(lay, slot_cap=min(lay.slot_cap, first_slots))
                                                 for lay in started.layouts))
    if started.layouts[0].n_gpu_layers and not prompting.info.gpu_offload:
        log.warning("%s", gpu.offload_warning(started.layouts[0].n_gpu_layers))
    stretched = layouts.past_training_context(prompting.info.n_ctx_train, config.n_ctx)
    if stretched is not None:
        log.warning("%s", stretched)
    cut = (layouts.max_tokens_past_context(most_tokens, prompting.info.n_ctx_train, config.n_ctx, most_said_by)
           if most_said_by is not None else None)
    if cut is not None:
        log.warning("%s", cut)
    # this machine's: the host's available memory, or its cgroup's room where that is less
    here = system_memory()
    inputs = PlanInputs(started, tuple(replace(facts, n_questions=share(facts.n_questions, node, started.nodes))
                                       for node in started.nodes),
                        tuple(here.available if node.memory is None else node.memory for node in started.nodes),
                        config.slots, config.n_batch, config.n_ctx, prompting.info.gpu_offload)
    cgroup_limit = here.limit if here.by_cgroup else None  # named by a refusal on this machine
    settled = [layouts.settle(lay, facts_, slots=config.slots, n_ctx=config.n_ctx, max_tokens=most_tokens,
                              n_batch=config.n_batch, available=available, offload=inputs.offload, cores=node.cores,
                              gpus=node.gpus, cgroup_limit=cgroup_limit if node.memory is None else None)
               for node, lay, facts_, available in zip(started.nodes, started.layouts, inputs.facts, inputs.available)]
    plan = replace(started, layouts=tuple(lay for lay, _ in settled))
    return ContextGrowth(inputs, plan, [memory for _, memory in settled], model_path, prefix, prompting.generation,
                         caps_later)
