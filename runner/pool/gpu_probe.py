"""What the GPUs have free, asked before any worker loads: the memory plan's VRAM side
(runner/plan/vram.py) plans against it.

The question goes to a process of its own that exits at once (workers/llama/gpu_memory.py
report_gpus): the coordinator never loads llama.cpp, and a process that touches a GPU holds a
context there for as long as it lives. Asked before the workers start, the answer does not count
their own weights as taken. Only jobs that put layers on a GPU ask: a CPU job never starts a
GPU driver.
"""

from __future__ import annotations

import logging

import multiprocess as mp

from ...workers.helper_messages import GpuMemory
from ...workers.llama.gpu_memory import report_gpus
from ...workers.protocol import decode
from ..child_processes import start_child

log = logging.getLogger("ggbatch")

# Starting a GPU driver takes a second or two; a driver that hangs must not hang the job.
PROBE_TIMEOUT = 60.0


def free_gpu_memory() -> tuple[GpuMemory, ...]:
    """The GPUs llama.cpp may offload to, with their free memory now; () when it cannot tell
    (a CPU-only build, a probe that died or did not answer): VRAM is then not planned."""
    ctx = mp.get_context("spawn")
    results, child_end = ctx.Pipe(duplex=False)
    process = ctx.Process(target=report_gpus, args=(child_end,), name="ggbatch-gpus", daemon=True)
    start_child(process)  # shielded from a Ctrl-C to the group while it starts, as every child
    child_end.close()
    try:
        if results.poll(PROBE_TIMEOUT):
            found: tuple[GpuMemory, ...] = decode(results.recv_bytes())
            return found
        log.warning("the GPUs did not say their free memory within %.0f s: VRAM not planned", PROBE_TIMEOUT)
    except (EOFError, OSError):
        process.join(5)
        log.warning("the process reading the GPUs' free memory died (exit code %s): VRAM not planned",
                    process.exitcode)
    finally:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
    return ()
