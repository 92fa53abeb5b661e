"""Starting a Ray instance of the job's own: a stop while ray.init runs (ray.init puts in SIGTERM
handlers of its own, sys.exit, which must end as any SIGTERM of a run does: Interrupted, exit 143,
with what ray.init had started ended, not Ray's exit 15), and a layout its node cannot hold."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import ggbatch

pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install -e '.[test]'")

# In a process of its own (a Ray instance per process): a thread waits until ray.init has put in
# its SIGTERM handler, so the signal lands inside ray.init, then sends it.
STARTS_AND_IS_STOPPED = textwrap.dedent("""
    import os, signal, threading, time
    import psutil, ray
    from ggbatch.runner.errors import Interrupted
    from ggbatch.runner.pool.ray import connect

    ours = signal.getsignal(signal.SIGTERM)

    def stop_inside_ray_init():
        while signal.getsignal(signal.SIGTERM) is ours:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_inside_ray_init, daemon=True).start()
    try:
        connect(None)
    except Interrupted as exc:
        print("interrupted", exc.signum, exc.exit_code)
    print("initialized", ray.is_initialized())
    print("handler kept", signal.getsignal(signal.SIGTERM) is ours)
    time.sleep(2)  # what ray.shutdown ended has gone
    print("children", [p.name() for p in psutil.Process().children(recursive=True) if p.is_running()])
""")


@pytest.mark.timeout(150)
def test_a_sigterm_inside_ray_init_is_the_runs_stop_and_leaves_no_ray_process():
    done = subprocess.run([sys.executable, "-c", STARTS_AND_IS_STOPPED], capture_output=True, text=True, timeout=140)
    out = done.stdout.splitlines()
    assert "interrupted 15 143" in out, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "initialized False" in out and "handler kept True" in out, done.stdout
    assert "children []" in out, done.stdout


@pytest.mark.timeout(150)
def test_a_layout_a_ray_node_cannot_hold_is_refused_naming_the_node(tmp_path, demo_model):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"questionID": "a", "question": "2+2?"}\n')
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "o.jsonl",
                "--backend", "ray", "--workers", 64, timeout=140)
    assert r.returncode == 2, r.stderr
    # the cores counted are the node's Ray CPUs, not "here" (the coordinator's machine)
    assert "workers: 64 workers need at least 64 cores" in r.stderr and " are usable on node " in r.stderr, r.stderr
