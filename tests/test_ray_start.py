"""Starting a Ray instance of the job's own: a stop while ray.init runs (ray.init puts in SIGTERM
handlers of its own, sys.exit, where the run's must take it: exit 143, not Ray's exit 15 or a
crash), and a layout its node cannot hold."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import ggbatch

pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install -e '.[test]'")

# In a process of its own (a Ray instance per process). A thread sends the SIGTERM inside ray.init:
# once its GCS server runs (Ray's handlers kept out), or once Ray's own handler is in place (a Ray
# whose handlers go in another way, as `_ray_utils` gives none: then its SystemExit is the stop).
STARTS_AND_IS_STOPPED = textwrap.dedent("""
    import os, signal, sys, threading, time
    import psutil, ray
    import ggbatch.runner.pool.ray as ray_backend
    from ggbatch.runner.errors import Interrupted

    heard = []
    signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))  # the run's, as STOP's
    ours = signal.getsignal(signal.SIGTERM)
    older_ray = sys.argv[1] == "older"
    if older_ray:
        ray_backend._ray_utils = lambda: None

    def inside_ray_init():
        if older_ray:
            return signal.getsignal(signal.SIGTERM) is not ours
        return any(p.name() == "gcs_server" for p in psutil.Process().children(recursive=True))

    def stop_inside_ray_init():
        while not inside_ray_init():
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_inside_ray_init, daemon=True).start()
    try:
        print("connected", ray_backend.connect(None))
    except Interrupted as exc:
        print("interrupted", exc.signum, exc.exit_code)
    print("heard", heard)
    print("handler kept", signal.getsignal(signal.SIGTERM) is ours)
    print("initialized", ray.is_initialized())
    ray.shutdown()
    time.sleep(2)  # what ray.shutdown ended has gone
    print("children", [p.name() for p in psutil.Process().children(recursive=True) if p.is_running()])
""")


def _started_and_stopped(ray_kind):
    done = subprocess.run([sys.executable, "-c", STARTS_AND_IS_STOPPED, ray_kind], capture_output=True, text=True,
                          timeout=140)
    return done.stdout.splitlines(), (done.returncode, done.stdout, done.stderr[-2000:])


@pytest.mark.timeout(150)
def test_a_sigterm_inside_ray_init_reaches_the_runs_handler_and_ray_starts_whole():
    """Ray's handler raised SystemExit inside ray.init, its core worker half made: exit 15, or a
    crash at the process's exit (134, 139) in the second its core worker connects."""
    out, said = _started_and_stopped("current")
    assert out[:4] == ["connected True", "heard [15]", "handler kept True", "initialized True"], said
    assert "children []" in out, said


@pytest.mark.timeout(150)
def test_a_ray_whose_handler_cannot_be_kept_out_ends_its_sigterm_as_the_runs_stop():
    out, said = _started_and_stopped("older")
    assert out[:4] == ["interrupted 15 143", "heard []", "handler kept True", "initialized False"], said
    assert "children []" in out, said


@pytest.mark.timeout(150)
def test_a_layout_a_ray_node_cannot_hold_is_refused_naming_the_node(tmp_path, demo_model):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"questionID": "a", "question": "2+2?"}\n')
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "o.jsonl",
                "--backend", "ray", "--workers", 64, timeout=140)
    assert r.returncode == 2, r.stderr
    # the cores counted are the node's Ray CPUs, not "here" (the coordinator's machine)
    assert "workers: 64 workers need at least 64 cores" in r.stderr and " are usable on node " in r.stderr, r.stderr
