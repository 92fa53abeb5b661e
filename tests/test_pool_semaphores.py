"""What a pool leaves behind when its process ends in a way that runs no close(): a child of
multiprocessing or ProcessPoolExecutor (os._exit), SIGTERM's default action during a call or
while a worker starts. multiprocess's queues hold named semaphores that the resource tracker
reports as leaked after the exit unless they were released. Real processes on the demo model
(the fake engine where the model does not matter); every test has a hard timeout."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

IN_CHILDREN = textwrap.dedent("""
    import multiprocessing, sys, ggbatch
    from concurrent.futures import ProcessPoolExecutor

    def with_pool(i):
        with ggbatch.Pool(model=sys.argv[1], max_tokens=3, workers=1) as pool:
            return pool.answer([f"x{i}"])[0].error

    def with_answer(i):
        return ggbatch.answer([f"y{i}"], model=sys.argv[1], max_tokens=3, workers=1)[0].error

    if __name__ == "__main__":
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as ex:
            print(list(ex.map(with_pool, range(2))), flush=True)
        with multiprocessing.get_context("spawn").Pool(1) as mp_pool:  # its children are terminated
            print(mp_pool.map(with_answer, range(1)), flush=True)
        child = multiprocessing.get_context("fork").Process(target=with_answer, args=(0,))
        child.start()
        child.join()
        print(child.exitcode)
""")


@pytest.mark.timeout(240)
def test_a_pool_closed_in_a_multiprocessing_child_leaves_no_semaphore_behind(demo_model, tmp_path):
    """A child of multiprocessing or ProcessPoolExecutor leaves through os._exit (or is
    terminated), which runs none of the finalizers multiprocess releases a queue's semaphores by:
    each pool (or answer()) closed there made the resource tracker warn "There appear to be 3
    leaked semaphore objects". close() releases them itself."""
    script = tmp_path / "children.py"
    script.write_text(IN_CHILDREN)
    done = subprocess.run([sys.executable, str(script), demo_model], cwd=tmp_path, capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["[None, None]", "[None]", "0", ""], done.stderr
    assert "leaked" not in done.stderr, done.stderr


TERMINATED = textwrap.dedent("""
    import os, signal, sys, threading, ggbatch

    if __name__ == "__main__":
        # every slot from the start: the call does not start the worker again (the window below)
        with ggbatch.Pool(model=sys.argv[1], max_tokens=64, workers=1, start_small=False) as pool:
            pool.answer(["warm"])  # the worker and the tokenizer have answered once
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            pool.answer([f"Once upon a time {i}" for i in range(5000)])
""")


@pytest.mark.timeout(180)
def test_sigterm_during_a_pool_call_leaves_no_semaphore_behind(demo_model, tmp_path):
    """SIGTERM with Python's default action ends the script at once, running no close(): the
    queues' named semaphores, released only there, made the resource tracker warn "There appear
    to be 6 leaked semaphore objects" after the exit. Their names go once each child has opened
    them (its first message), so an end at any later moment leaves none."""
    script = tmp_path / "terminated.py"
    script.write_text(TERMINATED)
    done = subprocess.run([sys.executable, str(script), demo_model], cwd=tmp_path, capture_output=True, text=True,
                          timeout=150)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "leaked" not in done.stderr, done.stderr


STARTING = textwrap.dedent("""
    import os, signal, sys, threading, ggbatch
    sys.path.insert(0, sys.argv[2])
    from fake_engine import Fake

    if __name__ == "__main__":
        # well after the worker said Started (Python's start and imports take seconds on a busy
        # machine), long before its engine is built: the window the test is about
        threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        ggbatch.Pool(model=sys.argv[1], workers=1, engine_factory=Fake(build_s=60))
""")


@pytest.mark.timeout(180)
def test_sigterm_while_a_worker_starts_leaves_no_semaphore_behind(demo_model, tmp_path):
    """The worker's first message was its Ready, after the model and the context: a SIGTERM
    before it (a pool starting, or a worker starting again with more slots or context) left the
    names of its queue's semaphores, and the tracker warned of them. It now says Started first.
    What is left: the second or so a worker process takes to start Python and open its queue
    (a SIGTERM there, or as a warm pool's growth starts its workers again, still warns)."""
    script = tmp_path / "starting.py"
    script.write_text(STARTING)
    done = subprocess.run([sys.executable, str(script), demo_model, str(Path(__file__).parent)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "leaked" not in done.stderr, done.stderr
