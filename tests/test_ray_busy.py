"""A cluster whose CPUs other jobs hold: Ray leaves a worker's actor unplaced, and the run said
nothing while it waited. On a real local Ray instance (test_ray.py's), with the fake engine."""

from __future__ import annotations

import logging
import time

import pytest

from fake_engine import Fake

ray = pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install -e '.[test]'")

from test_ray import cluster, ray_specs  # noqa: E402,F401  (cluster: the module's Ray instance)


@ray.remote(num_cpus=2)
class OtherJob:
    def ready(self):
        return True


@pytest.mark.timeout(120)
def test_a_worker_ray_cannot_place_is_said_to_wait_naming_what_it_needs_and_starts_once_free(
        cluster, caplog, monkeypatch):  # noqa: F811
    import ggbatch.runner.pool.ray as ray_backend

    monkeypatch.setattr(ray_backend, "PENDING_NOTICE_S", 1.0)
    holder = OtherJob.remote()  # every CPU of the 2-CPU instance
    ray.get(holder.ready.remote())
    backend, specs, _ = ray_specs(1, Fake())
    link = backend.start(specs[0])
    try:
        with caplog.at_level(logging.WARNING, logger="ggbatch"):
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                assert backend.wait([link], 0.5) == []  # unplaced: nothing comes back
        said = [r.getMessage() for r in caplog.records if "waits for Ray to place it" in r.getMessage()]
        assert said == [f"worker 0 waits for Ray to place it: it needs 1 CPU on node {specs[0].node_ip}, which has "
                        "0 of its 2 CPUs free (other jobs hold the rest: `ray status` shows them); it starts once "
                        "they are free"], said  # once, not at every wait
        ray.kill(holder)
        deadline = time.monotonic() + 60
        while not link.placed and time.monotonic() < deadline:
            backend.wait([link], 0.5)
        assert link.placed and not link.ended
    finally:
        link.kill()
