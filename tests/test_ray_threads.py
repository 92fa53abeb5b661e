"""A Ray actor's threads within its cores, at its start and at every later change (the thread
controller's SetThreads): on a real local Ray instance, with the fake engine (test_ray.py's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fake_engine import Fake
from ggbatch.runner.pool.pool import WorkerPool

pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install -e '.[test]'")

from test_ray import cluster, qs, ray_specs  # noqa: E402,F401  (cluster: the module's Ray instance)


@pytest.mark.timeout(180)
def test_a_ray_actor_told_more_threads_than_its_cores_keeps_to_its_cores(cluster):  # noqa: F811
    """The cap held at the actor's start only: a SetThreads above its cores was taken as asked."""
    backend, specs, engine = ray_specs(1, Fake(slow=0.002, threads=True))  # one core
    acks, started = [], []

    def on_answers(answers):
        if not started:
            started.append(pool.llama_threads()[0].current)
            pool.set_threads(0, 2)

    pool = WorkerPool(specs, on_answers=on_answers, on_threads=acks.append, backend=backend)
    answers = pool.run(qs(400), replace(engine, n_threads=2))
    assert len(answers) == 400 and started == [1]  # capped at its start
    assert [(a.worker_id, a.before, a.n_threads) for a in acks] == [(0, 1, 1)]  # and when told 2
