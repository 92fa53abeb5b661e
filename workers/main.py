"""The worker process: pin, load, then pull questions and push answers until told to stop.

    tasks (Chunk | Stop) ──▶ engine.add ──▶ engine.step() ──▶ results pipe (AnswerBatch)
                          ◀── WantWork when fewer than 2 × slots questions are left locally
                          ◀── EngineStats at most every 0.5 s while stepping, and when it runs dry
    tasks (SetThreads) ──▶ llama.cpp's thread count, between two steps ──▶ ThreadsSet

The worker never blocks while its engine has work: it drains the task queue without waiting,
runs one step, ships whatever finished. It blocks only when it has nothing at all to do.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import time
import traceback
from dataclasses import replace
from typing import Any, Optional

from .devices import visible_device_env
from .engine.interface import Engine
from .llama.load_errors import ModelLoadError
from .protocol import (
    STATS_EVERY_S,
    AnswerBatch,
    Chunk,
    Configure,
    EngineConfig,
    EngineStats,
    Ready,
    SetThreads,
    Started,
    Stop,
    ThreadsSet,
    WantWork,
    WorkerError,
    decode,
    encode,
)
from .spec import WorkerSpec

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def worker_main(spec: WorkerSpec, tasks: Any, results: Any) -> None:
    """Entry point of a worker process. Takes only picklable config; loads the model here.
    `results` is the writing end of a pipe of this worker's own: no lock shared with the other
    workers, so being killed in the middle of a message can never block them."""
    leave_signals_to_parent()
    die_with_parent()
    _redirect_stderr(spec.log_path)
    results.send_bytes(encode(Started(spec.worker_id)))
    if not run_worker(spec, tasks, results):
        raise SystemExit(1)
    # Told to stop with nothing left: leave at once. Every answer is already in the results
    # pipe (its writes are synchronous), and the kernel frees the weights and KV cache in about
    # half the time llama_free and the interpreter's teardown take (0.07 s against 0.13 s, 28
    # layers × 1024 with 32 slots), time the coordinator would spend waiting to reap us.
    os._exit(0)


def run_worker(spec: WorkerSpec, tasks: Any, results: Any) -> bool:
    """A worker's life, wherever it lives (a process of its own, or a Ray actor's thread: see
    workers/ray_actor.py): pin, load, wait for Configure, then serve until told to stop (a later
    Configure builds the engine again in place: _Engines). `tasks` has get()/get_nowait()
    (raising queue.Empty) of encoded messages, `results` has send_bytes(). Returns False after
    reporting an error (a WorkerError), True after a Stop."""
    # Read when libggml loads: without it, an abort forks gdb to print a backtrace (seconds). A
    # local worker starts with it (runner/child_processes.py); a Ray actor's process does not.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    if spec.device is not None:  # before llama.cpp lists its GPUs (workers/devices.py)
        os.environ.update(visible_device_env(spec.device, os.environ))
    engines = _Engines(spec, results)
    try:
        # Pin before the model loads, so llama.cpp's thread pool is created on our cores.
        os.sched_setaffinity(0, spec.cores)
        engines.preload(spec.repack)
        first = decode(tasks.get())  # Configure, or Stop if the job needs no answering after all
        if not isinstance(first, Configure):
            return True
        engines.configure(first)
        _serve(engines, spec, tasks, results)
        # The engine stays open: the caller ends the process at once, which frees it faster.
        return True
    except BaseException as exc:  # report anything, then die: the coordinator decides what next
        results.send_bytes(encode(WorkerError(spec.worker_id, engines.stage, type(exc).__name__, str(exc),
                                              traceback.format_exc(), isinstance(exc, ModelLoadError))))
        if engines.engine is not None:
            engines.engine.close()
        return False


class _Engines:
    """The worker's engine, built on the weights loaded at start-up when the first Configure comes,
    and built again in place when another comes (the pool grown to a larger context): the old
    engine's context is freed first, and its weights are kept for the new one where they are
    loaded alike (the same repack), so the process, its imports and the model's load are not
    paid again (on a GPU, CUDA's start and the weights' copy). `stage` names what an error
    interrupted."""

    def __init__(self, spec: WorkerSpec, results: Any) -> None:
        self.spec, self.results = spec, results
        self.engine: Optional[Engine] = None
        self.config: Optional[EngineConfig] = None
        self.offload = (0, 0)  # (the n_gpu_layers llama.cpp was given, the layers it put on a GPU)
        self.load_s = 0.0  # this life's time loading the weights and building engines, so far
        self.stage = "load"

    def preload(self, repack: bool) -> None:
        """Load the weights now (at the start, while the coordinator is still tokenizing the
        questions; again where a new engine wants them loaded otherwise)."""
        t0 = time.perf_counter()
        self.offload = self.spec.engine_factory.preload(self.spec.model_path, repack, self.spec.n_gpu_layers,
                                                        self.spec.device is not None)
        self.load_s += time.perf_counter() - t0

    def configure(self, msg: Configure) -> Engine:
        """The engine msg asks for, built, and Ready said with this life's load_s so far."""
        t0 = time.perf_counter()
        self.stage = "configure"
        config = replace(msg.engine, n_threads=within_cores(self.spec, msg.engine.n_threads))
        if self.engine is not None:
            if self.engine.n_unfinished:
                raise RuntimeError("a new engine was asked for while this one still held questions")
            keep = self.config is not None and self.config.repack == config.repack
            self.engine.close(keep_weights=keep)
            self.engine = None
            if not keep:
                self.preload(config.repack)
        engine = self.engine = self.spec.engine_factory.build(config, self.spec.worker_id)
        self.config, self.stage = config, "run"
        self.load_s += time.perf_counter() - t0
        self.results.send_bytes(encode(Ready(self.spec.worker_id, os.getpid(), self.load_s,
                                             engine.n_threads, tuple(sorted(os.sched_getaffinity(0))),
                                             *self.offload, engine.memory_kind.value)))
        return engine


def within_cores(spec: WorkerSpec, n_threads: int) -> int:
    """No more threads than the cores a Ray actor runs on, at its start and at each later change
    (SetThreads): its planned positions wrap round onto fewer where Ray counts more CPUs than the
    node's processes may use (`ray start --num-cpus` above its cores), and more threads than cores
    only wait for each other. A local worker's n_threads as given: its cores are its planned
    threads, and the pool's tests set the two apart on purpose."""
    on_ray = spec.node_id is not None
    return len(spec.cores) if on_ray and 0 < len(spec.cores) < n_threads else n_threads


def leave_signals_to_parent() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP. A terminal's Ctrl-C reaches the whole process group, and
    so do systemd's and Slurm's SIGTERM and the SIGHUP a closed terminal's shell sends its jobs,
    but the coordinator decides what happens to the questions in flight (it ends its children
    itself, and a coordinator killed takes them with it: die_with_parent). All came blocked from
    the coordinator (runner/child_processes.py), so that none could kill this process while it
    started; ignoring one discards it if it came."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for s in signals:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def die_with_parent() -> None:
    """If the coordinator is killed (kill -9, OOM), its workers must not live on holding cores
    and memory: ask Linux to SIGKILL this process when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the worker notices on its next queue operation
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _redirect_stderr(log_path: Optional[str]) -> None:
    """Send this process's stderr (file descriptor 2, where llama.cpp's C code writes its asserts
    and aborts) to the coordinator's log file for this worker; with GGBATCH_LLAMA_LOG set (llama.cpp's
    own log wanted, for debugging) it stays on the terminal."""
    if log_path and not os.environ.get("GGBATCH_LLAMA_LOG"):
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)


def _serve(engines: _Engines, spec: WorkerSpec, tasks: Any, results: Any) -> None:
    engine = engines.engine
    assert engine is not None
    target = 2 * engine.slots  # questions held locally: a full batch plus a full refill
    asked = False
    stopping = False
    stats = _StatsSender(spec.worker_id, results)
    while True:
        if not asked and not stopping and engine.n_unfinished < target:
            results.send_bytes(encode(WantWork(spec.worker_id, target - engine.n_unfinished)))
            asked = True
        idle = engine.n_unfinished == 0
        if idle and stopping:
            return
        for msg in _messages(tasks, block=idle):
            if isinstance(msg, Stop):
                stopping = True
                engine.drop_waiting()
            elif isinstance(msg, Configure):  # sent only once this worker holds nothing
                engine = engines.configure(msg)
                target, asked = 2 * engine.slots, False
            elif isinstance(msg, Chunk):
                for question in msg.questions:
                    engine.add(question)
                asked = False
            elif isinstance(msg, SetThreads):
                results.send_bytes(encode(set_threads(engine, spec.worker_id, within_cores(spec, msg.n))))
        if engine.n_unfinished:
            answers = engine.step()
            # Before the answers: the coordinator's totals are whole when the last answer arrives.
            stats.after_step(engine)
            if answers:
                results.send_bytes(encode(AnswerBatch(spec.worker_id, tuple(answers), engine.stats())))


def set_threads(engine: Engine, worker_id: int, n: int) -> ThreadsSet:
    """Change llama.cpp's thread count between two steps; the answer says the count before and
    the one llama.cpp reports after (unchanged where the engine cannot change it)."""
    before = engine.n_threads
    return ThreadsSet(worker_id, before, engine.set_threads(n), int(engine.stats().get("steps", 0)))


class _StatsSender:
    """EngineStats at most every STATS_EVERY_S while the engine steps, and when it runs dry."""

    def __init__(self, worker_id: int, results: Any) -> None:
        self.worker_id = worker_id
        self.results = results
        self.next_at = 0.0

    def after_step(self, engine: Engine) -> None:
        now = time.monotonic()
        if now >= self.next_at or engine.n_unfinished == 0:
            self.next_at = now + STATS_EVERY_S
            self.results.send_bytes(encode(engine_stats(self.worker_id, engine.stats())))


def engine_stats(worker_id: int, counters: dict[str, float]) -> EngineStats:
    """The message from the engine's counters. Prompt tokens are the engine's own count of those
    it decoded (`prompt_computed`, the report's prompt_tokens_computed): one owner, where a
    formula from the batch's tokens missed the shared prefix, each sample's fork and each
    answer cut under a grammar."""
    return EngineStats(worker_id, int(counters.get("steps", 0)), int(counters.get("busy_slots", 0)),
                       int(counters.get("generated_tokens", 0)), int(counters.get("prompt_computed", 0)))


def _messages(tasks: Any, block: bool) -> list[Any]:
    """Everything waiting on the task queue; waits for the first message only if `block`."""
    out = []
    try:
        out.append(decode(tasks.get() if block else tasks.get_nowait()))
        while True:
            out.append(decode(tasks.get_nowait()))
    except queue.Empty:
        pass
    return out
