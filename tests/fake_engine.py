"""A fake engine implementing the real engine interface (ggbatch.workers.engine.interface.Engine), for
testing the coordinator across real processes in milliseconds. It answers each question with a
text derived from its id and token count, `slots` questions per step.

Its behaviour is a `Fake`, a picklable EngineFactory that goes where the real engine's would
(`WorkerSpec.engine_factory`, `run_job(engine_factory=...)`) and crosses into the spawned worker:

    Fake()                                  answer everything
    Fake(slow=0.01)                         sleep per step (seconds)
    Fake(exit_after=N, marker=P)            os._exit(3) after N answers, once (P marks that it happened)
    Fake(raise_after=N, marker=P)           raise RuntimeError after N answers, once
    Fake(exit_every=N)                      every worker life ends with os._exit(3) after N answers, at its
                                            first step holding two questions or more (a death holding one
                                            alone is what a question that kills workers looks like)
    Fake(segv_on=QID)                       crash with SIGSEGV whenever QID is admitted
    Fake(memory_on=QID)                     ask for more memory than any address space holds whenever QID
                                            is answered ("*": every question): MemoryError, and the worker dies
    Fake(fail_load=True)                    raise at start-up, like a model llama.cpp cannot load
    Fake(no_context=True)                   raise ModelLoadError at start-up, as a worker that cannot make its
                                            context (not enough memory) does: the run ends with a ModelError
    Fake(exit_after=N, marker=P, fail_load_once_marked=True)
                                            die after N answers, then fail every start-up
    Fake(started=P)                         touch P when a step first holds a question (tests wait on it)
    Fake(environ_to=P)                      write the worker's GPU-visibility variables to P (JSON) at start
    Fake(threads=True)                      set_threads keeps the count it is given, as the real engine's
                                            llama.cpp context does (without it the count stays, and the
                                            worker says so)
    Fake(build_s=S)                         take S seconds to build (as a real engine allocates its KV cache
                                            and decodes the shared prefix before it is Ready)
    Fake(build_gate=P)                      wait until P exists to finish building (tests hold a worker
                                            short of Ready)
    Fake(threads=True, first_step_threads_to=P)
                                            write the thread count its first step runs with to P
    Fake(context=True)                      refuse a prompt its context per sequence cannot hold, as the
                                            real engine does
    Fake(max_context=N)                     raise ModelLoadError building a context of more than N tokens per
                                            sequence, as a worker short of memory for a larger one does
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ggbatch.workers.engine.memory_kind import MemoryKind
from ggbatch.workers.llama.load_errors import ModelLoadError
from ggbatch.workers.protocol import Answer, EngineConfig, FinishReason, Question


@dataclass(frozen=True)
class Fake:
    slow: float = 0.0
    exit_after: Optional[int] = None
    raise_after: Optional[int] = None
    marker: Optional[str] = None
    exit_every: Optional[int] = None
    segv_on: Optional[str] = None
    memory_on: Optional[str] = None
    fail_load: bool = False
    no_context: bool = False
    fail_load_once_marked: bool = False
    started: Optional[str] = None
    environ_to: Optional[str] = None
    threads: bool = False
    build_s: float = 0.0
    first_step_threads_to: Optional[str] = None
    context: bool = False
    build_gate: Optional[str] = None
    max_context: Optional[int] = None

    def preload(self, model_path: str, repack: bool, n_gpu_layers: int, one_device: bool) -> tuple[int, int]:
        return n_gpu_layers, 0  # no weights to load

    def build(self, config: EngineConfig, worker_id: int) -> "FakeEngine":
        return FakeEngine(config, worker_id, self)


class FakeEngine:
    def __init__(self, config: EngineConfig, worker_id: int, fake: Fake = Fake()) -> None:
        if fake.fail_load or (fake.fail_load_once_marked and Path(fake.marker or "/nonexistent").exists()):
            raise RuntimeError("fake engine refused to load")
        if fake.no_context or (fake.max_context is not None and config.n_ctx_seq > fake.max_context):
            raise ModelLoadError("not enough memory to create the fake engine's context")
        if fake.environ_to:
            visible = {k: v for k, v in os.environ.items() if "VISIBLE_DEVICES" in k}
            Path(fake.environ_to).write_text(json.dumps(visible))
        self.fake = fake
        self.slots = config.slots
        self.worker_id = worker_id
        self.waiting: deque[Question] = deque()
        self.answered = 0  # in this process's life
        self.steps = 0
        self.busy = 0  # slots busy, summed over steps
        self.prompt_tokens = 0  # of the questions answered
        self._threads = config.n_threads
        self.memory_kind = MemoryKind.ATTENTION
        self.n_ctx_seq = config.n_ctx_seq
        self.refused: list[Answer] = []
        time.sleep(fake.build_s)
        while fake.build_gate and not Path(fake.build_gate).exists():
            time.sleep(0.01)

    @property
    def n_threads(self) -> int:
        return self._threads

    def set_threads(self, n: int) -> int:
        """Fake(threads=True): the count changes as llama.cpp's would; else it stays."""
        if self.fake.threads:
            self._threads = n
        return self._threads

    @property
    def n_unfinished(self) -> int:
        return len(self.waiting) + len(self.refused)

    def add(self, question: Question) -> None:
        if self.fake.context and len(question.tokens) >= self.n_ctx_seq:
            self.refused.append(Answer(qid=question.qid, text="", finish_reason=FinishReason.ERROR,
                                       prompt_tokens=len(question.tokens), worker_id=self.worker_id,
                                       error=f"prompt has {len(question.tokens)} tokens, context per sequence is "
                                             f"{self.n_ctx_seq}"))
            return
        self.waiting.append(question)

    def step(self) -> list[Answer]:
        self.steps += 1
        fake = self.fake
        if fake.started and self.waiting:
            Path(fake.started).touch()
        if fake.first_step_threads_to and self.steps == 1:
            Path(fake.first_step_threads_to).write_text(str(self._threads))
        if fake.exit_every and self.answered >= fake.exit_every and len(self.waiting) > 1:
            # After the last answers went out, holding the next ones: a random kill between answers.
            # Dying at once holds whatever came next, and a lone suspect retried on a worker due to
            # die would be failed as a killer after two such deaths (the pool is right to: see
            # runner/pool/crashes.py).
            os._exit(3)
        if fake.slow:
            time.sleep(fake.slow)
        out, self.refused = self.refused, []
        self.busy += min(self.slots, len(self.waiting))
        for _ in range(min(self.slots, len(self.waiting))):
            q = self.waiting.popleft()
            if fake.segv_on == q.qid:
                # In this thread, as a crash in llama.cpp is: a Ray actor's worker runs in a thread,
                # and a signal sent to the process could land on another one while this goes on.
                signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
            if fake.memory_on in (q.qid, "*"):
                bytearray(1 << 44)  # 16 TiB: refused under ulimit -v, as a long prompt's buffers can be
            out.append(Answer(qid=q.qid, text=f"answer to {q.qid} ({len(q.tokens)} tokens)",
                              finish_reason=FinishReason.STOP, prompt_tokens=len(q.tokens), completion_tokens=3,
                              worker_id=self.worker_id, ttft_s=0.001, latency_s=0.002))
            self.answered += 1
            self.prompt_tokens += len(q.tokens)
            self._maybe_fail()
        return out

    def _maybe_fail(self) -> None:
        marker = Path(self.fake.marker or "/nonexistent")
        if marker.exists():
            return
        if self.fake.exit_after is not None and self.answered >= self.fake.exit_after:
            marker.touch()
            os._exit(3)
        if self.fake.raise_after is not None and self.answered >= self.fake.raise_after:
            marker.touch()
            raise RuntimeError("fake engine failed mid-run")

    def stats(self) -> dict[str, float]:
        # As the real engine counts: 3 tokens generated per answer, the first two fed back.
        return {"steps": float(self.steps), "busy_slots": float(self.busy),
                "generated_tokens": 3.0 * self.answered, "batch_tokens": float(self.prompt_tokens + 2 * self.answered),
                "prompt_computed": float(self.prompt_tokens)}

    def drop_waiting(self) -> int:
        n = len(self.waiting)
        self.waiting.clear()
        return n

    def close(self, keep_weights: bool = False) -> None:
        pass
