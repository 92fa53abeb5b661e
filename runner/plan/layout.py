"""The one owner of a job's layout: how many workers, their cores and threads, whether llama.cpp
repacks the weights (runner/plan/repack.py decides), how many sequences (slots) each decodes
together, the context per sequence, the KV layout and the step's token budget.

It is decided in two phases, because workers start (and load the model) while the coordinator is
still tokenizing:

    start()   before tokenizing: workers × threads, the cores of each, the weight layout. Slots
              are estimated from the record count (the weight layout depends on them), and a
              `ggbatch tune` choice is looked up at a context guessed from the characters. With
              GPUs (`devices`), one worker per device, each pinned to its share of the cores.
    settle()  after tokenizing: the context per sequence, the KV layout, the slots, within the
              memory plan (runner/plan/memory.py), which may keep fewer workers or slots; and, now
              that the tokenizer process has said whether llama.cpp can offload, the threads of
              a worker whose layers are all on a GPU (runner/plan/gpu.py).

Pure functions over numbers and lists: every rule is unit-tested.
"""

from __future__ import annotations

import logging
import math
import os
from array import array
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from ...workers.engine.invariant import kv_streams, step_budget
from ...workers.helper_messages import GpuMemory
from ...workers.protocol import EngineConfig, GenerationParams, Question, kv_cells
from ..config.checks import AUTO
from ..errors import ConfigError, KeysError
from ..words import counted
from . import attention, gpu, vram
from .memory import MemoryPlan, ModelDims, allocated_kv_cells, describe, fit_layout, too_little
from .repack import repack_weights

log = logging.getLogger("ggbatch")

# Auto slots. With one KV stream per sequence (the usual layout) each token's attention scans
# only its own sequence's cells, so more slots keep paying off for as long as memory lasts (the
# memory plan has the last word). On the 28 × 1024 benchmark model: 128 GSM8K questions × 64
# tokens, S_TG 233 / 267 / 307 tok/s at 16 / 32 / 64 slots; 96 questions × 256 tokens (~400 KV
# cells a sequence) 123 s at 20 slots, 111 s at 32, 94 s at 48. In one unified pool (long shared
# prefix) every token scans every slot's cells, and past a few thousand cells attention costs as
# much as the weights, so there long sequences get fewer slots.
MAX_AUTO_SLOTS = 64
MAX_AUTO_POOL_CELLS = 8192
# Before the questions are tokenized only their characters are known. ~4 characters make a token
# of English in a large BPE vocabulary, fewer in small vocabularies and other scripts: 3 is in
# between, and the tune cache's power-of-two context buckets absorb the error.
CHARS_PER_TOKEN = 3
CHAT_TEMPLATE_TOKENS = 32  # role markers and the like that a chat template adds around the text
# Auto n_batch (a step's token budget, also llama.cpp's n_ubatch). With the prefix cache a prompt
# step is a passage, or several questions' own parts each in a ubatch of its own
# (workers/engine/ubatches.py): a larger budget takes a whole ~700-token prompt in one ubatch and more own
# parts a step, in fewer steps (LSAT-64 on the benchmark model: 45 steps instead of 59, and faster:
# docs/guide/prefix-cache.md, "n_batch 1024 with the prefix cache"). Without it, 512: W1/W2/W4 were
# measured there.
N_BATCH = 512
N_BATCH_PREFIX_CACHE = 1024


@dataclass(frozen=True)
class Layout:
    workers: int
    threads: int  # per worker
    slots: int  # sequences per worker
    cores: tuple[tuple[int, ...], ...]  # cores[i] = the cores worker i is pinned to
    repack: bool = True  # weights in llama.cpp's CPU_REPACK layout (repack_weights)
    repack_reason: str = ""
    # settled once the prompts are tokenized (0 / False before)
    n_ctx_seq: int = 0  # KV cells each sequence may use: longest prompt + max_tokens
    kv_unified: bool = False  # one KV pool for all slots, or one stream per sequence
    n_batch: int = 0  # tokens of one decode step
    slot_cap: int = MAX_AUTO_SLOTS  # most auto slots: the default, or what `ggbatch tune` measured
    batch_invariant: bool = False  # answers independent of their batch: no repacking, no unified pool
    n_gpu_layers: int = 0  # layers each worker asks llama.cpp to store in VRAM (gpu.GPU_ALL: all)
    devices: tuple[int, ...] = ()  # devices[i] = the GPU of worker i (none: every GPU llama.cpp finds)
    threads_auto: bool = True  # the job left threads on auto (settle may pick GPU threads)
    prefix_cache: bool = False  # workers keep and share prompts' KV (workers/engine/prefix_cache.py)
    # the job's flash_attn (AUTO: undecided) until settled decides what the workers run
    # (runner/plan/attention.py); batch-invariant mode turns it off whatever it says
    flash_attn: Optional[bool] = AUTO


@dataclass(frozen=True)
class PromptFacts:
    """What the layout needs to know of the tokenized prompts."""

    n_questions: int  # left to answer
    longest: int  # tokens of the longest prompt
    n_prefix: int  # tokens every prompt starts with
    n_ctx_train: int  # the model's training context (0 = unknown)
    dims: ModelDims
    shared_groups: int = 0  # groups of questions sharing more than n_prefix (runner/questions/prefix_groups.py)
    scored: bool = False  # questions score continuations (log-likelihood): one KV stream per sequence
    samples: int = 1  # the most samples one question draws: they decode together, a slot each


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask, not the machine's core count)."""
    return sorted(os.sched_getaffinity(0))


# -- phase 1: before tokenizing ------------------------------------------------------------------


def start(cores: Sequence[int], *, workers: Optional[int] = None, threads: Optional[int] = None,
          slots: Optional[int] = None, repack: Optional[bool] = None, n_records: int, flags: frozenset[str],
          tuned: Optional[Mapping[str, Any]] = None, devices: Sequence[int] = (), n_gpu_layers: int = 0,
          batch_invariant: bool = False, hybrid: bool = False, repack_refused: str = "",
          nothing_to_repack: bool = False, where: str = "here") -> Layout:
    """The workers to start now (None = auto; `tuned`: what `ggbatch tune` chose, used for what
    the job leaves to auto). Slots are an estimate from the record count. `devices`: one worker
    per GPU, each pinned to an equal share of the cores. `where`: the cores' machine, as a refusal
    names it ("on node 10.0.0.7 (...)" for a Ray node)."""
    cap = MAX_AUTO_SLOTS
    if devices:
        workers, tuned = gpu.workers_for_devices(devices, workers, len(cores)), None  # tune measured CPUs
    threads_auto = threads is None and not tuned
    if tuned:
        workers, threads, cap = tuned["workers"], tuned["threads"], tuned["slots"]
    layout = plan_layout(cores, workers=workers, threads=threads, slots=slots, n_questions=max(1, n_records),
                         max_auto_slots=cap, where=where)
    use_repack, why = repack_weights(repack, tuned.get("repack") if tuned else None, flags, layout.slots,
                                     batch_invariant, hybrid, repack_refused, nothing_to_repack)
    return replace(layout, repack=use_repack, repack_reason=why, slot_cap=cap, n_gpu_layers=n_gpu_layers,
                   devices=tuple(devices), threads_auto=threads_auto, batch_invariant=batch_invariant)


def plan_layout(cores: Sequence[int], *, workers: Optional[int] = None, threads: Optional[int] = None,
                slots: Optional[int] = None, n_questions: int, pool_cells_per_slot: int = 0,
                max_auto_slots: int = MAX_AUTO_SLOTS, where: str = "here") -> Layout:
    """Choose workers × threads within the usable cores (None = auto) and give each worker a
    disjoint set of cores. Never more worker threads than usable cores. `pool_cells_per_slot`
    (the KV one sequence adds to a unified pool beyond the shared prefix; 0 with one stream per
    sequence) limits auto slots on long sequences."""
    n_cores = len(cores)
    if workers is not None and workers > n_cores:
        raise KeysError(f"workers: {workers} workers need at least {workers} cores, "
                        f"{n_cores} {'is' if n_cores == 1 else 'are'} usable {where}", ("workers",))
    if threads is not None and threads > n_cores:
        raise KeysError(f"threads: {threads} threads per worker exceed the {counted(n_cores, 'core')} usable {where}",
                        ("threads",))
    if workers is None:
        # Neither given: one worker using every core: continuous batching inside one context shares
        # the weight reads across all sequences, which several smaller workers cannot (docs/guide/layout.md).
        workers = 1 if threads is None else max(1, n_cores // threads)
    if threads is None:
        threads = max(1, n_cores // workers)
    if workers * threads > n_cores:
        raise KeysError(f"workers × threads = {workers} × {threads} = {workers * threads} "
                        f"exceeds the {counted(n_cores, 'core')} usable {where}", ("workers", "threads"))
    if slots is None:
        by_kv = MAX_AUTO_POOL_CELLS // pool_cells_per_slot if pool_cells_per_slot > 0 else max_auto_slots
        slots = max(1, min(max_auto_slots, max(4, by_kv), math.ceil(n_questions / workers)))
    assignment = tuple(tuple(cores[i * threads:(i + 1) * threads]) for i in range(workers))
    return Layout(workers, threads, slots, assignment)


def estimate_context(prompt_chars: int, max_tokens: int, n_ctx: Optional[int]) -> int:
    """Tokens per sequence guessed before tokenizing: context_per_sequence with the prompt's
    tokens guessed from its characters; the job's own n_ctx when it sets one."""
    guessed = math.ceil(prompt_chars / CHARS_PER_TOKEN) + CHAT_TEMPLATE_TOKENS
    return context_per_sequence(guessed, max_tokens, 0, n_ctx)


# -- phase 2: after tokenizing -------------------------------------------------------------------


def settle(started: Layout, facts: PromptFacts, *, slots: Optional[int] = None, n_ctx: Optional[int] = None,
           max_tokens: int, n_batch: Optional[int] = None, available: int, offload: bool = False,
           cores: Optional[Sequence[int]] = None, gpus: Sequence[GpuMemory] = (),
           cgroup_limit: Optional[int] = None) -> tuple[Layout, MemoryPlan]:
    """The layout of the workers already started, now that the prompts are known: context, KV
    layout and slots, shrunk (slots first, then workers) to the memory available. `offload`:
    this llama.cpp build can offload, so the layers the job puts on a GPU leave RAM, a worker with
    every layer there needs few threads, and with the GPUs' free memory known (`gpus`) the plan
    fits them in VRAM too. `cores`, `available`: the machine's (default: this one's usable cores;
    runner/plan/nodes.py gives a Ray node's). `cgroup_limit`: where `available` is a cgroup's room,
    its limit, which a refusal names (`free` on the host shows room the job does not have)."""
    n_ctx_seq = context_per_sequence(facts.longest, max_tokens, facts.n_ctx_train, n_ctx)
    layout, memory = settled(started, facts, n_ctx_seq, slots=slots, n_batch=n_batch, available=available,
                             offload=offload, cores=cores, gpus=gpus)
    if not memory.fits:
        raise ConfigError(too_little(memory, cgroup_limit))
    if memory.note:
        log.warning("memory plan: %s (%s)", memory.note, describe(memory))
    return layout, memory


def settled(started: Layout, facts: PromptFacts, n_ctx_seq: int, *, slots: Optional[int], n_batch: Optional[int],
            available: int, offload: bool = False, cores: Optional[Sequence[int]] = None,
            gpus: Sequence[GpuMemory] = ()) -> tuple[Layout, MemoryPlan]:
    """settle's layout for a given context per sequence, without a word: memory.fits says
    whether one worker with one slot fits (a streamed file's context grows through here,
    runner/plan/growth.py)."""
    invariant = started.batch_invariant
    cache = facts.shared_groups > 0
    unified = kv_unified_for(facts.n_prefix, n_ctx_seq, invariant, cache, facts.scored)
    n_batch = batch_budget(n_batch, cache, invariant)
    pool_cells = n_ctx_seq - facts.n_prefix if unified else 0
    cpu_share = gpu.cpu_layer_share(started.n_gpu_layers, facts.dims.n_layer, offload)
    on_gpu = started.n_gpu_layers if offload else 0  # a build without GPU offload keeps every layer here
    flash = attention.flash_attn_for(started.flash_attn, on_gpu, n_ctx_seq) and not invariant

    def cells(s: int) -> int:
        return allocated_kv_cells(kv_cells(s, n_ctx_seq, facts.n_prefix, unified, invariant),
                                  kv_streams(s, invariant), unified)

    def scored_cells(s: int) -> int:  # what a prompt step's attention scores span without flash attention
        return 0 if flash else cells(s) if unified else allocated_kv_cells(n_ctx_seq, 1, False)

    fit = (vram.vram_fit(facts.dims, cells, lambda s: step_budget(n_batch, s, invariant), 1 - cpu_share, gpus,
                         started.devices)
           if offload and started.n_gpu_layers else None)
    cap = gpu.auto_slot_cap(started.slot_cap, cpu_share, fit is not None)
    wanted = plan_layout(usable_cores() if cores is None else cores, workers=started.workers,
                         threads=started.threads, slots=slots, n_questions=facts.n_questions,
                         pool_cells_per_slot=pool_cells, max_auto_slots=cap).slots
    if slots is None:  # past the auto cap if need be (the memory plan still has the last word)
        wanted = max(wanted, facts.samples)
    layout = replace(started, slots=wanted, n_ctx_seq=n_ctx_seq, kv_unified=unified, prefix_cache=cache,
                     n_batch=step_budget(n_batch, wanted, invariant), flash_attn=flash,
                     threads=gpu.worker_threads(started.threads, started.threads_auto, started.n_gpu_layers, offload))
    memory = fit_layout(facts.dims, layout.workers, layout.slots, cells, layout.n_batch, available,
                        repacked=layout.repack, cpu_share=cpu_share, vram=gpu.vram_note(layout.n_gpu_layers, offload),
                        vram_fit=fit, scored_cells_for=scored_cells, scored_rows=layout.n_batch if facts.scored else 0)
    if memory.fits and memory.note:
        layout = replace(layout, workers=memory.workers, slots=memory.slots, cores=layout.cores[:memory.workers],
                         devices=layout.devices[:memory.workers], n_batch=step_budget(n_batch, memory.slots, invariant))
    return layout, memory


def prompt_length(question: Question) -> int:
    """The tokens a question's sequence holds before it generates any: its prompt, and its longest
    continuation when it is scored (log-likelihood), as the plan's `longest` counts them."""
    return len(question.tokens) + max(map(len, question.continuations), default=0)


def answer_tokens(question: Question, generation: GenerationParams) -> int:
    """The most tokens a question may generate: its own max_tokens, else the job's (`generation`);
    none for one that only scores continuations (log-likelihood), whose context need not hold any."""
    return 0 if question.continuations else (question.generation or generation).max_tokens


def context_per_sequence(longest_prompt: int, max_tokens: int, n_ctx_train: int,
                         requested: Optional[int]) -> int:
    """Tokens of KV each sequence may use: as asked, or just enough for the longest prompt plus
    max_tokens, capped by what the model was trained for (0 = unknown)."""
    if requested is not None:
        return requested
    need = longest_prompt + max_tokens + 1
    return min(need, n_ctx_train) if n_ctx_train > 0 else need


def past_training_context(n_ctx_train: int, requested: Optional[int]) -> Optional[str]:
    """What to warn of when the context asked for is longer than the model was trained for (as
    llama.cpp warns: n_ctx_per_seq > n_ctx_train); None when it is not, or either is unknown."""
    if requested is None or n_ctx_train <= 0 or requested <= n_ctx_train:
        return None
    return (f"model.n_ctx: {requested} is more than the {n_ctx_train} tokens of context the model was trained "
            f"for: past {n_ctx_train} tokens its answers may be garbage, unless it was made to stretch its context")


def max_tokens_past_context(most_tokens: int, n_ctx_train: int, requested: Optional[int],
                            said_by: str = "max_tokens") -> Optional[str]:
    """What to warn of when max_tokens alone is more than a sequence's context can ever hold: no
    answer reaches it, each ends where the context does (finish_reason length). None otherwise.
    `said_by`: where that max_tokens was given (the job's key, or a question's own)."""
    limit = context_limit(n_ctx_train, requested)
    if limit <= 0 or most_tokens < limit:
        return None
    whose = "model.n_ctx" if requested is not None else "the model's training context"
    return (f"{said_by}: {most_tokens} is more than a sequence's whole context ({limit} tokens, {whose}): "
            "an answer ends where its context does (finish_reason length), not at max_tokens")


def context_limit(n_ctx_train: int, requested: Optional[int]) -> int:
    """The most context per sequence the job's workers can ever have (0: no limit known), as
    context_per_sequence and runner/plan/growth.py size it: a prompt that does not fit it fails
    whatever the memory holds."""
    return requested if requested is not None else n_ctx_train


def kv_unified_for(n_prefix: int, n_ctx_seq: int, batch_invariant: bool, prefix_cache: bool = False,
                   scored: bool = False) -> bool:
    """One KV pool when the shared prefix is longer than the rest of a sequence (it is then
    stored once instead of copied into every slot); otherwise one stream per sequence, whose
    attention scans only its own cells. Measurements in workers/llama/engine.py. The prefix cache
    (questions sharing more than that prefix) keeps prompts in the slots' own streams. Scored
    continuations want their own streams too: in one pool their log-probabilities move with the
    rest of the batch (up to 0.004 nats a token on stories260K, 2e-6 with a stream each), and
    the bar is llama-cpp-python's own within 0.01 nats for the whole continuation."""
    return not batch_invariant and not prefix_cache and not scored and n_prefix > n_ctx_seq - n_prefix


def batch_budget(n_batch: Optional[int], prefix_cache: bool, batch_invariant: bool) -> int:
    """n_batch as asked, or auto: larger for the prefix cache's prompt steps (N_BATCH_PREFIX_CACHE),
    except in batch-invariant mode, whose batch shapes are laid out for N_BATCH."""
    if n_batch is not None:
        return n_batch
    return N_BATCH_PREFIX_CACHE if prefix_cache and not batch_invariant else N_BATCH


def engine_config(model_path: str, layout: Layout, prefix: array[int], generation: GenerationParams) -> EngineConfig:
    """What each worker builds its engine from."""
    invariant = layout.batch_invariant
    return EngineConfig(model_path=model_path, n_threads=layout.threads, slots=layout.slots,
                        n_ctx_seq=layout.n_ctx_seq, n_batch=layout.n_batch, prefix_tokens=prefix,
                        generation=generation, kv_unified=layout.kv_unified,
                        kv_cells=kv_cells(layout.slots, layout.n_ctx_seq, len(prefix), layout.kv_unified, invariant),
                        flash_attn=bool(layout.flash_attn) and not invariant, repack=layout.repack,
                        batch_invariant=invariant, prefix_cache=layout.prefix_cache)
