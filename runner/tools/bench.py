"""`ggbatch bench`: how fast can this machine go with this model, and what does the runner cost?

For each (PP, TG, B): the raw engine loop (B sequences of PP prompt tokens in one context, TG
generated tokens each, no coordinator, no processes) gives llama-batched-bench's table; then the
whole runner (pool, pinned worker, dispatch, answers) answers the same B × 2 questions and its
throughput is compared with the raw loop on the same work.

    PP, TG, B   prompt tokens, generated tokens, sequences decoded together
    N_KV        KV cells used: B × (PP + TG)
    T_PP, S_PP  time and tokens/s of the prompt steps
    T_TG, S_TG  time and tokens/s of the generation steps
    T, S        total time and all tokens / total time
"""

from __future__ import annotations

import random
import statistics
import time
from array import array
from itertools import groupby
from typing import Any, Sequence

from ...workers.engine.invariant import step_budget
from ...workers.protocol import EngineConfig, GenerationParams, Question
from ...workers.spec import WorkerSpec
from ..plan import layout as layouts
from ..plan.layout import Layout, kv_unified_for, plan_layout, usable_cores
from ..pool.pool import WorkerPool
from .plot import write_figure

COLUMNS = ["PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"]


def synthetic_questions(n: int, pp: int, n_vocab: int, seed: int = 0) -> list[Question]:
    """n prompts of exactly pp random ordinary tokens (no shared prefix, as batched-bench)."""
    rng = random.Random(seed)
    low = min(1000, n_vocab // 4)  # keep clear of control tokens at the start of the vocabulary
    return [Question(f"b{i}", array("i", (rng.randrange(low, n_vocab) for _ in range(pp))), i)
            for i in range(n)]


def engine_config(model: str, threads: int, slots: int, n_ctx_seq: int, prefix: array[int], max_tokens: int,
                  repack: bool) -> EngineConfig:
    """One worker's engine configured as a job's would be (runner/plan/layout.py), greedy, generating
    exactly max_tokens per question."""
    layout = Layout(1, threads, slots, (), repack, "bench", n_ctx_seq,
                    kv_unified_for(len(prefix), n_ctx_seq, batch_invariant=False),
                    step_budget(512, slots, invariant=False))
    return layouts.engine_config(model, layout, prefix, GenerationParams(max_tokens=max_tokens, ignore_eos=True))


def batched_bench_config(model: str, threads: int, pp: int, tg: int, b: int, repack: bool) -> EngineConfig:
    # tg + 1 sampled tokens means PP + TG decoded ones, as llama-batched-bench decodes: the
    # prompt step gives the first token, then TG generation steps follow.
    return engine_config(model, threads, b, pp + tg + 2, array("i"), tg + 1, repack)


def run_engine(config: EngineConfig, questions: Sequence[Question], warm_up: bool,
               gpu_layers: int = 0) -> tuple[float, dict[str, float]]:
    """The engine alone, in this process: (seconds from first step to last answer, its stats).
    gpu_layers: layers stored in VRAM (GPU_ALL: every one), on the first GPU, as a worker with
    `devices: [0]` loads them."""
    from ...workers.llama.factory import LLAMA_ENGINE

    if gpu_layers:
        LLAMA_ENGINE.preload(config.model_path, config.repack, gpu_layers, one_device=True)
    engine = LLAMA_ENGINE.build(config, worker_id=0)
    try:
        if warm_up:
            engine.warm_up()
        for q in questions:
            engine.add(q)
        t0 = time.perf_counter()
        while engine.n_unfinished:
            engine.step()
        return time.perf_counter() - t0, engine.stats()
    finally:
        engine.close()


def raw_row(model: str, threads: int, pp: int, tg: int, b: int, n_vocab: int,
            repeat: int = 1, repack: bool = True, gpu_layers: int = 0) -> dict[str, Any]:
    """One line of the table: B sequences in one context, one wave, after a warm-up decode, like
    llama-batched-bench. With repeat > 1 each time is the median of that many fresh runs."""
    config = batched_bench_config(model, threads, pp, tg, b, repack)
    runs = [run_engine(config, synthetic_questions(b, pp, n_vocab), warm_up=True, gpu_layers=gpu_layers)
            for _ in range(repeat)]
    total = statistics.median(t for t, _ in runs)
    t_tg = statistics.median(st["tg_steps_s"] for _, st in runs)
    tg_tokens = runs[0][1]["tg_tokens"]
    t_pp = total - t_tg
    return {"PP": pp, "TG": tg, "B": b, "N_KV": b * (pp + tg), "T_PP s": t_pp, "S_PP t/s": b * pp / t_pp,
            "T_TG s": t_tg, "S_TG t/s": tg_tokens / t_tg if t_tg else 0.0, "T s": total,
            "S t/s": b * (pp + tg) / total, **step_split(runs)}


def step_split(runs: Sequence[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Where the steps' time went (medians over the runs): llama_decode's call, reading the logits
    rows and picking tokens, and the engine's own Python around them. On a GPU llama_decode may
    return before the device is done; the first read of the logits then waits for it, so the wait
    lands in "pick s"."""
    decode = statistics.median(st["decode_s"] for _, st in runs)
    pick = statistics.median(st["sample_s"] for _, st in runs)
    step = statistics.median(st["step_s"] for _, st in runs)
    return {"decode s": decode, "pick s": pick, "python s": max(0.0, step - decode - pick)}


def overhead_row(model: str, workers: int, threads: int, pp: int, tg: int, b: int,
                 n_vocab: int, repack: bool = True, gpu_layers: int = 0) -> dict[str, Any]:
    """The same work per worker (3 × B questions, so slots are refilled) by the engine alone and
    by the whole runner: `workers` pinned worker processes of `threads` threads and B slots,
    dispatch, answers, timed from the first worker ready to the last answer. The raw rate is the
    engine's alone times `workers`, as if the workers did not share the machine's memory
    bandwidth. Overhead = how much lower the runner's tokens/s is."""
    layout = plan_layout(usable_cores(), workers=workers, threads=threads, slots=b, n_questions=3 * b * workers)
    questions = synthetic_questions(3 * b * workers, pp, n_vocab, seed=1)
    # No warm-up here: the runner's worker pays for the first use of its buffers too.
    config = batched_bench_config(model, threads, pp, tg, b, repack)
    raw_s, _ = run_engine(config, questions[:3 * b], warm_up=False, gpu_layers=gpu_layers)
    last: list[float] = []
    pool = WorkerPool([WorkerSpec(i, cores, model, repack=repack, n_gpu_layers=gpu_layers,
                                  device=0 if gpu_layers else None) for i, cores in enumerate(layout.cores)],
                      on_answers=lambda answers: last.append(time.perf_counter()))
    pool.run(questions, config)
    runner_s = last[-1] - (pool.first_ready_at or last[-1])
    work = len(questions) * (pp + tg)  # the raw engine did 1/workers of it in raw_s
    return {"PP": pp, "TG": tg, "B": b, "workers": workers, "raw S t/s": work / raw_s,
            "runner S t/s": work / runner_s, "overhead %": 100.0 * (1 - raw_s / runner_s)}


def _width(columns: Sequence[str]) -> int:
    return max(8, *(len(c) for c in columns))


def header(columns: Sequence[str]) -> str:
    """The two header lines of a table as llama-batched-bench prints it (Markdown)."""
    w = _width(columns)
    return ("| " + " | ".join(f"{c:>{w}}" for c in columns) + " |\n"
            + "|" + "|".join("-" * (w + 2) for _ in columns) + "|")


def row_line(row: dict[str, Any], columns: Sequence[str]) -> str:
    w = _width(columns)
    return "| " + " | ".join(f"{row[c]:>{w}d}" if isinstance(row[c], int) else f"{row[c]:>{w}.2f}"
                             for c in columns) + " |"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    columns = list(rows[0]) if rows else COLUMNS
    return "\n".join([header(columns), *(row_line(r, columns) for r in rows)])


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    keys = list(rows[0]) if rows else COLUMNS
    return "\n".join([",".join(keys)] + [",".join(str(r[k]) for k in keys) for r in rows]) + "\n"


def require_matplotlib() -> None:
    """Fail before a long benchmark, not after it, when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'ggbatch[plot]'") from None


def plot(rows: Sequence[dict[str, Any]], path: str, role: str) -> None:
    """S_TG and S against B, one line per (PP, TG), in the format `path`'s extension names (PNG
    without one; plot.write_figure). `role`: what the file is to the command, for an error."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, (ax_tg, ax_all) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for (pp, tg), members in groupby(sorted(rows, key=lambda r: (r["PP"], r["TG"], r["B"])),
                                     key=lambda r: (r["PP"], r["TG"])):
        group = list(members)
        b = [r["B"] for r in group]
        ax_tg.plot(b, [r["S_TG t/s"] for r in group], marker="o", label=f"PP {pp}, TG {tg}")
        ax_all.plot(b, [r["S t/s"] for r in group], marker="o", label=f"PP {pp}, TG {tg}")
    for ax, title in ((ax_tg, "S_TG: generated tokens/s"), (ax_all, "S: prompt + generated tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("B (sequences per decode)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    write_figure(fig, path, role, dpi=120)
