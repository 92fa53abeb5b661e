"""ggbatch.Pool's life: started in the background or from a thread that ends, closed from another
thread while a call is made, left open at exit, Ctrl-C in the caller, a cancelled call, a call
from a forked child. Real processes on the demo model (the fake engine where the model does
not matter); every test has a hard timeout: a hang is a failure."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import psutil
import pytest

import ggbatch
from fake_engine import Fake
from helpers import children, wait_for

pytestmark = pytest.mark.model


CALLER = textwrap.dedent("""
    import signal, sys, psutil, ggbatch
    if __name__ == "__main__":
        # Ctrl-C as a terminal's program gets it, whatever this test's runner was started with
        # (a shell's background job, `cmd &`, starts with SIGINT ignored, and so do its children)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # work for far longer than the test takes to send its signal, however loaded the machine
        with ggbatch.Pool(model=sys.argv[1], max_tokens=2000, ignore_eos=True, workers=1) as pool:
            future = pool.submit_many([f"Once upon a time {i}" for i in range(256)])
            print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)), flush=True)
            future.result()
""")


@pytest.mark.timeout(120)
def test_ctrl_c_in_the_caller_ends_every_worker_and_leaks_nothing(demo_model, tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    proc = subprocess.Popen([sys.executable, str(script), demo_model], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert pids
    time.sleep(1)  # the caller waits in future.result() by then, its pool's threads at work
    os.kill(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    # heard while the call is far from answered (a wait for it heard Ctrl-C only once it was)
    assert time.monotonic() - sent < 20
    assert "KeyboardInterrupt" in err and "leaked" not in err, err
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                             for p in pids), 10, "the pool's processes to end")


@pytest.mark.timeout(120)
def test_a_pool_started_in_the_background_returns_before_its_workers_are_ready(demo_model, tmp_path):
    gate, before = tmp_path / "gate", children()
    starting = ggbatch.Pool.starting(model=demo_model, workers=1, slots=2, engine_factory=Fake(build_gate=str(gate)))
    # its worker cannot be Ready while the gate is shut: a start that waited would hang here
    wait_for(lambda: children() - before, what="the pool's processes to start")
    assert not starting.done()
    assert not starting.cancel()  # running: a pool half started would have no one to close it
    gate.touch()
    with starting.result(timeout=60) as pool:
        answers = pool.answer(["q0", "q1", "q2"])
    assert [a.id for a in answers] == ["0", "1", "2"] and all(a.text and a.error is None for a in answers)


@pytest.mark.timeout(120)
def test_a_background_start_refuses_typos_at_once_and_hands_over_what_failed_later(demo_model, tmp_path):
    with pytest.raises(ggbatch.GgbatchError, match="max_tokenz"):
        ggbatch.Pool.starting(model=demo_model, max_tokenz=3)
    with pytest.raises(ggbatch.GgbatchError, match="model file not found"):
        ggbatch.Pool.starting(model=str(tmp_path / "absent.gguf"))
    # a grammar, a schema and templates need no model: refused at once too, not by .result()
    for settings, said in [({"answer": {"grammar": "root ::= foo"}}, r"^ggbatch.Pool\(\): answer.grammar: not a"),
                           ({"answer": {"json_schema": {"type": "frob"}}}, r"^ggbatch.Pool\(\): answer.json_schema: "),
                           ({"prompt": {"template": "{% if %}"}}, r"^ggbatch.Pool\(\): prompt.template: line 1: "),
                           ({"prompt": {"chat_template": "{% if %}"}},
                            r"^ggbatch.Pool\(\): prompt.chat_template: line 1: ")]:
        with pytest.raises(ggbatch.GgbatchError, match=said):
            ggbatch.Pool.starting(model=demo_model, **settings)
    starting = ggbatch.Pool.starting(model=demo_model, workers=1, engine_factory=Fake(fail_load=True))
    with pytest.raises(ggbatch.GgbatchError, match="fake engine refused to load"):
        starting.result(timeout=60)


@pytest.mark.timeout(120)
def test_a_closed_background_pool_lets_go_of_its_pipes_and_semaphores(demo_model):
    """Pool.starting's exit handler kept every pool it started, closed or not, until the process
    exited: two pipe fds and three semaphores each, so a long-running process ran out of fds."""
    def started() -> ggbatch.Pool:
        pool = ggbatch.Pool.starting(model=demo_model, workers=1, max_tokens=2).result(timeout=60)
        assert pool.answer(["Once upon a time"])[0].text
        return pool

    started().close()  # what a process makes once, whichever pool is first
    gc.collect()
    fds = _fds_held()
    for _ in range(3):
        pool = started()
        pool.close()
        closed = weakref.ref(pool)
        del pool
        gc.collect()
        assert closed() is None, gc.get_referrers(closed())
    assert _fds_held() <= fds


def _fds_held() -> int:
    """The fds this process holds for good: the fewest of several looks, since another thread of
    this process (earlier tests leave some running: Ray's, after ray.shutdown) may hold a file for a
    moment just when one looks."""
    looks = []
    for _ in range(10):
        looks.append(len(os.listdir("/proc/self/fd")))
        time.sleep(0.02)
    return min(looks)


@pytest.mark.timeout(120)
def test_a_pool_made_in_a_thread_that_has_ended_still_answers(demo_model):
    # Its worker and tokenizer die with the thread that started them (PR_SET_PDEATHSIG) unless
    # they are started from one that lives on (runner/child_processes.py).
    made: list[ggbatch.Pool] = []
    maker = threading.Thread(target=lambda: made.append(ggbatch.Pool(model=demo_model, workers=1, max_tokens=4)))
    maker.start()
    maker.join()
    with made[0] as pool:
        answers = pool.answer(["Once upon a time", "The little dog"])
        stats = pool.stats()
    assert all(a.text and a.error is None for a in answers)
    assert stats["workers"][0]["restarts"] == 0


UNCLOSED = textwrap.dedent("""
    import sys, time
    import psutil
    import ggbatch
    from ggbatch.runner.warm.pool import Pool
    if __name__ == "__main__":
        settings = dict(model=sys.argv[1], workers=1, max_tokens=4, ignore_eos=True)
        if sys.argv[2] == "still starting":  # ggbatch eval stopped by a task's error while its model loads
            Pool.starting(**settings)
            while not psutil.Process().children():  # exits as its processes start
                time.sleep(0.01)
            print(True)
            sys.exit(0)
        pool = Pool.starting(**settings).result() if sys.argv[2] == "started" else ggbatch.Pool(**settings)
        print(pool.answer(["Once upon a time"])[0].text is not None, flush=True)
        if sys.argv[2] == "open call":  # a call still open as the process exits
            call = pool.submit_many([f"q{i}" for i in range(64)], max_tokens=400)
            call.add_done_callback(lambda c: print("call ended:", c.exception(), flush=True))
""")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["made", "started", "open call", "still starting"])
def test_a_pool_left_open_at_exit_is_closed_quietly(demo_model, tmp_path, how):
    # lm-eval never closes its model: at exit the pool stops its workers itself, before
    # multiprocess's exit handler terminates them and the pool's loop reports their deaths.
    # One still starting is waited for, then closed: the interpreter ended under its children
    # still reading their start (a SemLock traceback each), or waited for good on its workers.
    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED)
    done = subprocess.run([sys.executable, str(script), demo_model, how], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=120)
    said = done.stdout.split("\n")
    assert done.returncode == 0 and said[0] == "True", done.stderr
    assert "died" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    if how == "open call":  # cancelled, not waited for (nor left unanswered)
        assert said[1] == "call ended: ggbatch.Pool(): the process is exiting", done.stdout


@pytest.mark.timeout(120)
def test_a_cancelled_submit_is_let_go_without_a_traceback(demo_model, caplog):
    """Cancelling submit()'s Future logged `InvalidStateError: CANCELLED` from a callback once
    its answer came (the pool set the result of a Future the caller had cancelled)."""
    with ggbatch.Pool(model=demo_model, workers=1, max_tokens=64, ignore_eos=True) as pool:
        given_up = pool.submit("Once upon a time")
        assert given_up.cancel()
        kept = pool.submit("The little dog")
        assert kept.result(timeout=60).text
    # the pool closed once the worker had answered what it held: the cancelled question too, if
    # it had it already (its answer dropped), else it was never answered
    stats = pool.stats()
    assert given_up.cancelled() and stats["answered"] == 1 and stats["generated_tokens"] in (64, 128), stats
    assert "InvalidStateError" not in caplog.text and "exception calling callback" not in caplog.text, caplog.text


@pytest.mark.timeout(120)
def test_tokenize_on_a_closed_pool_says_the_pool_is_closed(demo_model):
    pool = ggbatch.Pool(model=demo_model, workers=1, max_tokens=4)
    assert len(pool.tokenize(["Once upon a time"])[0])
    pool.close()
    with pytest.raises(ggbatch.PoolClosed, match=r"^ggbatch.Pool.tokenize\(\): the pool is closed$"):
        pool.tokenize(["Once upon a time"])


@pytest.mark.timeout(240)
def test_a_close_while_a_call_is_tokenized_answers_it_and_a_later_call_is_refused(demo_model):
    """close() from another thread used to close the tokenizer under a call being made: the call
    failed with OSError('handle is closed'). Now a call made before the close is answered."""
    questions = [f"Question {i}: " + "word " * 60 for i in range(1500)]
    for delay in (0.05, 0.3):
        pool = ggbatch.Pool(model=demo_model, workers=1, max_tokens=1)
        outcome: list = []

        def call(pool: ggbatch.Pool, outcome: list) -> None:
            try:
                outcome.append(pool.answer(questions))
            except ggbatch.PoolClosed as exc:  # the close came first: the call was never made
                outcome.append(exc)

        caller = threading.Thread(target=call, args=(pool, outcome))
        caller.start()
        threading.Event().wait(delay)
        pool.close()
        caller.join(200)
        assert not caller.is_alive()
        (got,) = outcome  # any other exception would have ended the thread with nothing here
        if isinstance(got, list):
            assert len(got) == len(questions) and all(a.error is None for a in got)
        with pytest.raises(ggbatch.PoolClosed, match=r"the pool is closed$"):
            pool.answer(["Once upon a time"])


FORKED = textwrap.dedent("""
    import multiprocessing, sys
    import ggbatch

    def child(pool):
        for call in (lambda: pool.submit_many(["Tom"]), lambda: pool.answer(["Tom"]),
                     lambda: pool.tokenize(["Tom"])):
            try:
                call()
                print("child: answered", flush=True)
            except ggbatch.PoolClosed as exc:
                print("child:", exc, flush=True)
        pool.close()  # the child's copy: the parent's workers go on

    if __name__ == "__main__":
        pool = ggbatch.Pool(model=sys.argv[1], workers=1, max_tokens=4)
        first = pool.answer(["Tom"])[0].text
        forked = multiprocessing.get_context("fork").Process(target=child, args=(pool,))
        forked.start()
        forked.join(60)
        print("exit", forked.exitcode, flush=True)
        print("parent:", pool.answer(["Tom"])[0].text == first, flush=True)
        pool.close()
""")


@pytest.mark.timeout(180)
def test_a_pool_used_from_a_forked_child_says_so_at_once(demo_model, tmp_path):
    """A fork child that inherited a pool waited for good on the parent's tokenizer pipe."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    done = subprocess.run([sys.executable, str(script), demo_model], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=150)
    said = done.stdout.strip().split("\n")
    assert done.returncode == 0, done.stderr
    refused = [s for s in said if s.startswith("child: ")]
    assert len(refused) == 3 and all("this pool belongs to process" in s for s in refused), done.stdout
    assert refused[0].startswith("child: ggbatch.Pool.submit_many(): this pool belongs to process "), done.stdout
    assert said[-2:] == ["exit 0", "parent: True"], done.stdout + done.stderr


IN_CALLBACKS = textwrap.dedent("""
    import sys, threading
    import ggbatch
    if __name__ == "__main__":
        pool = ggbatch.Pool(model=sys.argv[1], workers=1, max_tokens=4)
        nested, closed = [], threading.Event()

        def ask_again(future):  # asyncio's and other callback code's way: the pool called from a callback
            nested.append(pool.answer(["The little dog"])[0].text)
            pool.submit("A cat").add_done_callback(close_there)

        def close_there(future):
            try:
                pool.close()
                print("closed in a callback:", future.result().text is not None, flush=True)
            finally:
                closed.set()

        pool.submit("Once upon a time").add_done_callback(ask_again)
        print("answered:", closed.wait(60) and nested[0] is not None, flush=True)
""")


@pytest.mark.timeout(120)
def test_a_futures_callback_may_call_the_pool_and_close_it(demo_model, tmp_path):
    """A Future's callbacks ran on the pool's loop thread: a call made in one waited there for
    an answer only that thread could give (the pool hung, and so did the process's exit), and
    close() in one raised 'cannot join current thread'."""
    script = tmp_path / "callbacks.py"
    script.write_text(IN_CALLBACKS)
    done = subprocess.run([sys.executable, str(script), demo_model], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=90)
    assert done.stdout.split("\n")[:2] == ["closed in a callback: True", "answered: True"], done.stderr
    assert done.returncode == 0 and "Traceback" not in done.stderr and "leaked" not in done.stderr, done.stderr


OS_FORKED = textwrap.dedent("""
    import os, sys
    import ggbatch

    if __name__ == "__main__":
        pool = ggbatch.Pool(model=sys.argv[1], workers=1, max_tokens=4)
        if os.fork() == 0:
            try:
                pool.answer(["Tom"])
            except ggbatch.PoolClosed:
                print("child: PoolClosed", flush=True)
            sys.exit(0)  # a normal exit: the interpreter's atexit callbacks run
        _, status = os.wait()
        print("child exit", os.waitstatus_to_exitcode(status), flush=True)
        print("parent:", pool.answer(["Tom"])[0].error, flush=True)
        pool.close()
""")


@pytest.mark.timeout(180)
def test_a_child_of_os_fork_ends_quietly_beside_the_parents_pool(demo_model, tmp_path):
    """A child of os.fork() made while a pool was open ended with multiprocess's traceback
    ("AssertionError: can only join a child process"): its exit tried to join the pool's processes,
    which are the parent's, not its own."""
    script = tmp_path / "os_forked.py"
    script.write_text(OS_FORKED)
    done = subprocess.run([sys.executable, str(script), demo_model], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=150)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["child: PoolClosed", "child exit 0", "parent: None", ""], done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
