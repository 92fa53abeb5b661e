"""The memory plan: will this layout fit in the memory that is available? Pure arithmetic.

What a worker holds, as llama.cpp reports it and as PSS measures it (28 × 1024 Q4_K_M model,
413 MiB file, 16 slots, two workers: plan 1,281 MiB, measured PSS 1,304 MiB):
- the model file, mmap'd: its pages are shared by all workers, counted once;
- when the weights are repacked (runner/plan/repack.py repack_weights), a private copy of those
  the repacked kernels take (llama.cpp's CPU_REPACK buffer: 161 MiB of that 405 MiB model; read
  from the tensor table, runner/plan/repack_share.py: none of an f16 file, 97% of a Q4_0 MoE),
  so every worker pays it again;
- its KV cache: layers × KV heads × head size × 2 (K and V) × 2 bytes (f16) per cell, with the
  cell count rounded up to a multiple of 256 as llama.cpp does; only the attention layers count,
  and a recurrent layer's state counts once per sequence (runner/plan/layers.py reads both from
  the GGUF header);
- the logits of one step and the part of the compute buffer a step touches (llama.cpp reserves
  300 MiB for it, but only about n_batch × n_embd × 80 bytes is ever written), llama.cpp's
  record of each KV cell (48 bytes, in RAM even when the cells are on a GPU; twice for a model
  with sliding-window layers, which has two caches), and the
  interpreter and libraries (~45 MiB).

Layers offloaded to a GPU take their weights and KV cache to VRAM: the plan counts the share of
the layers left on the CPU (runner/plan/gpu.py cpu_layer_share), and where the GPUs' free memory
is known, what the layers need there (runner/plan/vram.py, `vram_fit`): a layout fits when both
do. Unknown, VRAM is llama.cpp's, which fails the load when the layers do not fit; the plan says
which (`vram`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional

from ..model.gguf_header import HParam
from ..words import counted
from .attention import attention_scores_bytes
from .layers import LayerMemory, layer_memory

MIB = 1 << 20
OVERHEAD_PER_PROCESS = 45 * MIB  # Python, numpy, llama.cpp's code
ACTIVATION_BYTES = 80  # of the compute buffer a step writes, per token and embedding value
REPACKED_SHARE = 0.4  # of a file whose tensor table is unknown: weights llama.cpp copies into CPU_REPACK
KV_CELL_ROUNDING = 256
# llama.cpp's record of each KV cell in RAM, wherever the cell's K and V are: position, shift,
# the 256-bit set of sequences in it (llama_kv_cells). Measured: PSS grows by 47-52 bytes a cell
# past the plan from 16,384 to 2,621,440 cells, on attention and hybrid models alike; at 512K
# cells a sequence it is a large part of a hybrid worker's memory, whose K and V are a few layers' only.
CELL_BOOKKEEPING = 48
# A scored step's logits rows: the graph's result and llama.cpp's output buffer (both f32, each
# rows × vocabulary); numpy reads them in place.
SCORED_LOGITS_COPIES = 2


@dataclass(frozen=True)
class ModelDims:
    file_bytes: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ff: int = 0
    layers: Optional[LayerMemory] = None  # per layer, from the GGUF header; None: every layer attention
    # what llama.cpp copies into its repacked layouts (runner/plan/repack_share.py, from the tensor
    # table); None: unknown, REPACKED_SHARE of the file
    repacked_bytes: Optional[int] = None

    @property
    def kv_bytes_per_cell(self) -> int:
        if self.layers is not None:
            return self.layers.kv_bytes_per_cell
        return self.n_layer * self.n_head_kv * self.head_dim * 2 * 2  # K and V, f16

    @property
    def kv_caches(self) -> int:
        """The KV caches llama.cpp keeps, each with its own record of every cell: none for a
        recurrent model, two for one with sliding-window layers (llama_kv_cache_iswa: one cache for
        the windowed layers, one for the rest, both full size as ggbatch asks), else one."""
        if not self.kv_bytes_per_cell:
            return 0
        return 2 if self.layers is not None and self.layers.swa_kv_bytes_per_cell else 1

    @property
    def state_bytes_per_seq(self) -> int:
        """The recurrent layers' state of one sequence (0 for attention only)."""
        return self.layers.state_bytes_per_seq if self.layers is not None else 0


@dataclass(frozen=True)
class MemoryPlan:
    workers: int
    slots: int
    kv_cells_per_worker: int
    weights_per_worker: int
    kv_per_worker: int
    compute_per_worker: int
    shared_file_pages: int
    total: int
    available: int
    fits: bool
    note: str = ""
    cpu_share: float = 1.0  # of the layers (weights, KV cache) kept in RAM; the rest is in VRAM
    vram: str = ""  # what the plan says of VRAM, when the job offloads layers
    vram_per_worker: int = 0  # planned VRAM of a worker (0: not planned)

    def as_report(self) -> dict[str, Any]:
        def mib(b: float) -> float:
            return round(b / MIB, 1)
        return {"workers": self.workers, "slots": self.slots, "kv_cells_per_worker": self.kv_cells_per_worker,
                "weights_per_worker_mib": mib(self.weights_per_worker), "kv_per_worker_mib": mib(self.kv_per_worker),
                "compute_per_worker_mib": mib(self.compute_per_worker),
                "shared_file_pages_mib": mib(self.shared_file_pages), "total_mib": mib(self.total),
                "available_mib": mib(self.available), "fits": self.fits, "note": self.note,
                "cpu_layer_share": round(self.cpu_share, 3), "vram": self.vram,
                "vram_per_worker_mib": mib(self.vram_per_worker) if self.vram_per_worker else None}


def compute_bytes(dims: ModelDims, n_batch: int, slots: int, cells: int = 0, scored_cells: int = 0,
                  scored_rows: int = 0) -> int:
    """The compute buffer a step actually touches, the logits of every slot, llama.cpp's
    bookkeeping of its `cells` KV cells in each of its caches (ModelDims.kv_caches), the
    interpreter; without flash attention, a prompt step's attention scores over `scored_cells`
    (runner/plan/attention.py). A job scoring continuations (log-likelihood) has a logits row for
    each scored token of a step, up to `scored_rows` (its n_batch): written twice, by the graph and
    into llama.cpp's output buffer, then read a few rows at a time (workers/engine/logprobs.py):
    at n_batch 1024, 1.2 GB of a 150k vocabulary, where generating touches a row a slot."""
    activations = n_batch * dims.n_embd * ACTIVATION_BYTES
    logits = max(slots, 1) * dims.n_vocab * 4
    if scored_rows:
        logits = max(logits, scored_rows * dims.n_vocab * 4 * SCORED_LOGITS_COPIES)
    bookkeeping = cells * CELL_BOOKKEEPING * dims.kv_caches
    scores = attention_scores_bytes(n_batch, scored_cells, dims.n_head) if dims.kv_caches else 0
    return activations + logits + bookkeeping + scores + OVERHEAD_PER_PROCESS


def allocated_kv_cells(n_ctx: int, n_seq_max: int, unified: bool) -> int:
    """The KV cells llama.cpp allocates when asked for n_ctx (llama_context's constructor): n_ctx
    padded to a multiple of 256, and with one stream per sequence each stream's share padded to
    256 again. Measured: 64 slots × 213 tokens per sequence ask for 13,845 cells and get
    65 × 256 = 16,640, 140 MiB more KV on the 28 × 1024 model than the first padding alone."""
    n_ctx = _round_up(n_ctx)
    if unified or n_seq_max <= 1:
        return n_ctx
    return n_seq_max * _round_up(n_ctx // n_seq_max)


def _round_up(cells: int) -> int:
    return -(-cells // KV_CELL_ROUNDING) * KV_CELL_ROUNDING


# (workers, slots) -> (VRAM a worker needs, whether it fits, which GPUs): runner/plan/vram.py vram_fit
VramFit = Callable[[int, int], tuple[int, bool, str]]


def plan_memory(dims: ModelDims, workers: int, slots: int, kv_cells_for: Callable[[int], int],
                n_batch: int, available: int, *, repacked: bool = True, safety: float = 0.9,
                cpu_share: float = 1.0, vram: str = "", vram_fit: Optional[VramFit] = None,
                scored_cells_for: Callable[[int], int] = lambda slots: 0, scored_rows: int = 0) -> MemoryPlan:
    """The memory a layout needs, with `kv_cells_for(slots)` the KV pool a worker allocates and
    `scored_cells_for(slots)` the cells a prompt step's attention scores span (0 with flash attention);
    `scored_rows`: the logits rows a step of a log-likelihood job may output (compute_bytes).
    Without repacking, a worker's weights are the shared file pages alone. `cpu_share`: of the
    layers, those kept in RAM (the others' weights and KV cache are in VRAM, planned by
    `vram_fit` when the GPUs' memory is known)."""
    cells = _round_up(kv_cells_for(slots))
    # llama.cpp keeps a recurrent state for each sequence: every slot and the shared prefix's.
    kv = int((cells * dims.kv_bytes_per_cell + (slots + 1) * dims.state_bytes_per_seq) * cpu_share)
    compute = compute_bytes(dims, n_batch, slots, cells, scored_cells_for(slots), scored_rows)
    copied = dims.file_bytes * REPACKED_SHARE if dims.repacked_bytes is None else dims.repacked_bytes
    weights = int(copied * cpu_share) if repacked else 0
    file_pages = int(dims.file_bytes * cpu_share)
    total = workers * (weights + kv + compute) + file_pages
    budget = int(available * safety)
    vram_need, vram_fits, where = vram_fit(workers, slots) if vram_fit is not None else (0, True, "")
    return MemoryPlan(workers, slots, cells, weights, kv, compute, file_pages, total,
                      available, total <= budget and vram_fits, cpu_share=cpu_share,
                      vram=f"VRAM planned on {where}" if vram_fit is not None else vram, vram_per_worker=vram_need)


def fit_layout(dims: ModelDims, workers: int, slots: int, kv_cells_for: Callable[[int], int],
               n_batch: int, available: int, *, repacked: bool = True, cpu_share: float = 1.0,
               vram: str = "", vram_fit: Optional[VramFit] = None,
               scored_cells_for: Callable[[int], int] = lambda slots: 0, scored_rows: int = 0) -> MemoryPlan:
    """The plan for the requested layout, shrunk to fit RAM and VRAM: slots first (halving), and
    where not even one slot fits, a worker fewer (the last one: with devices, its GPU goes too)
    with the slots asked, halving again. The returned plan has fits=False only if one worker
    with one slot does not fit."""
    def plan_for(workers: int, slots: int) -> MemoryPlan:
        return plan_memory(dims, workers, slots, kv_cells_for, n_batch, available, repacked=repacked,
                           cpu_share=cpu_share, vram=vram, vram_fit=vram_fit, scored_cells_for=scored_cells_for,
                           scored_rows=scored_rows)

    asked = (workers, slots)
    for w in range(workers, 0, -1):  # each worker count from its full slots down, halving
        s = slots
        plan = plan_for(w, s)
        while not plan.fits and s > 1:
            s = max(1, s // 2)
            plan = plan_for(w, s)
        if plan.fits:
            break
    if (plan.workers, plan.slots) != asked:
        where = f"{available / MIB:.0f} MiB available" + (f" and {plan.vram}" if vram_fit is not None else "")
        plan = MemoryPlan(**{**asdict(plan), "note": f"shrunk from {counted(asked[0], 'worker')} × "
                             f"{counted(asked[1], 'slot')} to fit {where}"})
    return plan


def describe(plan: MemoryPlan) -> str:
    return (f"{counted(plan.workers, 'worker')} × ({plan.weights_per_worker / MIB:.0f} MiB repacked weights + "
            f"{plan.kv_per_worker / MIB:.0f} MiB KV + {plan.compute_per_worker / MIB:.0f} MiB compute) "
            f"+ {plan.shared_file_pages / MIB:.0f} MiB shared file pages = {plan.total / MIB:.0f} MiB, "
            f"{plan.available / MIB:.0f} MiB available"
            + (f"; VRAM {plan.vram_per_worker / MIB:,.0f} MiB a worker" if plan.vram_per_worker else "")
            + (f"; {plan.vram}" if plan.vram else ""))


def too_little(plan: MemoryPlan, cgroup_limit: Optional[int] = None) -> str:
    """The refusal of a plan where not even one worker with one slot fits; `cgroup_limit`: the
    limit of the cgroup whose room the available memory was."""
    held = (f"; this process's cgroup limits it to {cgroup_limit / MIB:.0f} MiB (a container's --memory, "
            "Slurm's --mem, systemd's MemoryMax)" if cgroup_limit is not None else "")
    return f"not enough memory for one worker with one slot: {describe(plan)}{held}"


def dims_from_metadata(meta: Callable[[str], Optional[str]], file_bytes: int, n_vocab: int,
                       hparams: Optional[Mapping[str, HParam]] = None,
                       repacked_bytes: Optional[int] = None) -> ModelDims:
    """ModelDims from GGUF metadata (`meta(key)` returns the value as text or None), and the
    per-layer memory from the header's values (`hparams`: runner/model/gguf_header.py
    read_hparams), which the text lacks: a hybrid's KV heads per layer."""
    arch = meta("general.architecture") or "llama"

    def num(key: str, default: int = 0) -> int:
        value = meta(f"{arch}.{key}")
        try:
            return int(float(value)) if value is not None else default
        except ValueError:
            return default

    n_embd = num("embedding_length", 1)
    n_head = num("attention.head_count", 1) or 1
    head_dim = num("attention.key_length", n_embd // n_head)
    return ModelDims(file_bytes, num("block_count", 1), n_embd, n_head,
                     num("attention.head_count_kv", n_head) or n_head, head_dim, n_vocab,
                     num("feed_forward_length", 4 * n_embd), layer_memory(hparams) if hparams else None,
                     repacked_bytes)
