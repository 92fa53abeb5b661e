"""Child processes started from a thread that lives as long as this process.

Workers and the tokenizer ask Linux to kill them when their parent dies (PR_SET_PDEATHSIG:
workers/main.py die_with_parent), so a coordinator killed with -9 leaves nothing behind. Linux
sends that signal when the *thread* that started the child exits, not the process: a pool made in
a thread that then ends (a pipeline's set-up thread, Pool.starting's) would have its workers and
tokenizer killed under it. So a child is started from the main thread, or else from one daemon
thread kept for that (a daemon: never joined, it ends with the process and only then are the
children told).

A spawned child imports the caller's script again (as `__mp_main__`) before it runs: a script
that starts ggbatch outside `if __name__ == "__main__":` starts it again in every child, where
multiprocess refuses to start a process from a process still starting. Such a child leaves at
once with UNGUARDED_MAIN_EXIT, which its parent reads as the script's mistake (exit_reason), not
as a tokenizer or worker that died loading the model.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from multiprocess import process as mp_process
from multiprocess import util as mp_util

# What a child's process state (psutil's name for it) says of a child that holds work and makes
# no progress: said after the state by the stall messages (runner/watch/stalls.py, the tokenizer's)
STATE_HINTS = {"stopped": ": SIGSTOP or a debugger? SIGCONT resumes it",
               "disk-sleep": ": waiting on the disk, swapping?",
               "tracing-stop": ": stopped by a debugger"}

CHILD_BLOCKED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # until the child ignores them itself
UNGUARDED_MAIN_EXIT = 86
UNGUARDED_MAIN = ("the script starts ggbatch when it is imported: ggbatch's processes are spawned and import "
                  "the script again, so the call must sit under `if __name__ == \"__main__\":` "
                  "(docs/guide/python-api.md)")

# What every child starts with, unless this process's own environment says otherwise. NumPy's
# OpenBLAS (llama-cpp-python imports numpy; ggbatch never uses it for math) otherwise reserves
# buffers for a thread per core in every child, which under `ulimit -v` is enough to fail the
# import; llama.cpp's abort handler otherwise starts gdb to print a backtrace to the terminal, where
# ggbatch reports a worker's death in one line. Given to the children only: set in this process
# when ggbatch was imported, it made a caller's own numpy, imported after ggbatch, compute on one
# thread.
CHILD_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "GGML_NO_BACKTRACE": "1"}

_requests: "queue.SimpleQueue[tuple[Callable[[], None], Future[None]]]" = queue.SimpleQueue()
_starter: Optional[threading.Thread] = None
_starter_lock = threading.Lock()
_environment_lock = threading.Lock()


def _forget_starter() -> None:
    """In a forked child the starter thread is gone (and the lock may be held by a thread that
    is): the child makes its own when it needs one. The processes multiprocess lists as children
    are the parent's (a pool's workers and tokenizer): a child of os.fork() that kept them tried
    to join them as it exited ("AssertionError: can only join a child process", a traceback at
    a normal exit). A multiprocess child forgets them in the same way as it starts."""
    global _requests, _starter, _starter_lock, _environment_lock
    _requests, _starter, _starter_lock = queue.SimpleQueue(), None, threading.Lock()
    _environment_lock = threading.Lock()
    mp_process._children = set()


os.register_at_fork(after_in_child=_forget_starter)


def leave_if_importing_script() -> None:
    """In a child of ours still importing the caller's script, that script starting ggbatch is
    its mistake: leave at once, before making anything (a queue or lock made here would stay
    registered with the resource tracker the parent shares, which then warns of leaked
    semaphores after the parent's one-line error)."""
    if getattr(mp_process.current_process(), "_inheriting", False):
        os._exit(UNGUARDED_MAIN_EXIT)


def release_queue(tasks: Any) -> None:
    """Close a multiprocess Queue to a child that has ended, and release its semaphores now. They
    are named ones, which multiprocess unlinks (and crosses off the resource tracker's list) only
    when the queue is collected or as the interpreter exits: a pool's objects refer to each other,
    so only the GC collects them, and a multiprocessing or ProcessPoolExecutor child using a pool
    leaves through os._exit, which runs neither. The tracker then warned of leaked semaphores."""
    tasks.close()
    tasks.cancel_join_thread()  # nobody reads it any more: what it holds is dropped
    release_names(tasks)


def release_names(tasks: Any) -> None:
    """Unlink a multiprocess Queue's named semaphores (and cross them off the resource tracker's
    list) while the queue stays in use: once the child it goes to has opened them (it has sent
    anything), nobody needs the names, and a parent ended at once (SIGTERM's default, SIGKILL)
    runs no close(); the tracker then warned of leaked semaphores. Idempotent."""
    locks = {id(lock) for lock in (tasks._rlock, tasks._wlock, tasks._sem) if lock is not None}
    for finalizer in list(mp_util._finalizer_registry.values()):
        held = getattr(finalizer, "_weakref", None)  # a Finalize made without an object has none
        if held is not None and id(held()) in locks:
            finalizer()  # its handles stay valid (the feeder thread may still hold one): the name goes


def start_child(process: Any) -> None:
    """process.start() (a multiprocess Process) from a thread that outlives the child
    (leave_if_importing_script first)."""
    leave_if_importing_script()
    if threading.current_thread() is threading.main_thread():
        _start_shielded(process)
        return
    done: Future[None] = Future()
    _requests.put((lambda: _start_shielded(process), done))
    _ensure_starter()
    done.result()


def _start_shielded(process: Any) -> None:
    """process.start() with SIGINT, SIGTERM and SIGHUP blocked in this thread, so that the child
    starts with them blocked: a Ctrl-C (or systemd's or Slurm's SIGTERM, or a closed terminal's
    SIGHUP) reaches the whole process group, and would otherwise kill a child still importing its
    modules, before it can ignore them (workers/main.py leave_signals_to_parent). Sent to this
    process meanwhile, a signal waits for the mask to be given back, or goes to another thread: it
    is not lost."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_BLOCKED)
    try:
        with _existing_folder(), _unreadable_script_kept_out(), child_environment():
            process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextmanager
def child_environment() -> Iterator[None]:
    """CHILD_ENVIRONMENT's variables this process lacks, set for the span of a start (a spawned
    child, or a local Ray instance's processes, copy the environment as they start), then taken
    away again."""
    with _environment_lock:  # a start on the main thread and one on the starter thread at once
        added = {name: value for name, value in CHILD_ENVIRONMENT.items() if name not in os.environ}
        os.environ.update(added)
        try:
            yield
        finally:
            for name in added:
                os.environ.pop(name, None)


@contextmanager
def _existing_folder() -> Iterator[None]:
    """The current folder, or "/" for the span of a start when it was removed during the run: a
    spawned child is told the parent's folder (os.getcwd, which then raises), and a worker's restart
    failed with a traceback, the answers file unwritten. The child's paths are absolute by then
    (runner/job.py); the removed folder is gone back to after, so that a relative path of the run
    fails as it would have, rather than naming a file under "/"."""
    try:
        os.getcwd()
    except FileNotFoundError:
        pass
    else:
        yield
        return
    folder = os.open(".", os.O_RDONLY)  # the removed folder still opens ("." needs no lookup)
    os.chdir("/")
    try:
        yield
    finally:
        os.fchdir(folder)
        os.close(folder)


@contextmanager
def _unreadable_script_kept_out() -> Iterator[None]:
    """A caller's script that cannot be read again (Python reading it from standard input, `python
    - <<EOF` in a shell script or a pipe, whose `__file__` is "<stdin>"; a script removed since)
    left out of a start: a spawned child runs the file `__main__.__file__` names before its own
    target, and failed at once on that one (FileNotFoundError), reported as a tokenizer that died
    loading the vocabulary. Without that name the child starts as from Python's prompt or `-c`.
    ggbatch's children need nothing of the script."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None or \
            os.path.isfile(os.path.join(mp_process.ORIGINAL_DIR or "", path)):  # as the child finds it
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _ensure_starter() -> None:
    global _starter
    with _starter_lock:
        if _starter is None:
            _starter = threading.Thread(target=_serve, name="ggbatch-child-starter", daemon=True)
            _starter.start()


def _serve() -> None:
    while True:
        start, done = _requests.get()
        try:
            start()
        except BaseException as exc:  # the caller's to handle, as if it had started the child itself
            done.set_exception(exc)
        else:
            done.set_result(None)


def exit_reason(code: Optional[int]) -> str:
    """How a child ended, from its exit code: "signal 9", "exit code 1", or the script's mistake."""
    if code == UNGUARDED_MAIN_EXIT:
        return UNGUARDED_MAIN
    return f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
