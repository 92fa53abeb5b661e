"""The Ray backend on a real local Ray instance (no mock of Ray): one instance for the module, 2
CPUs, no dashboard. Pool tests use the fake engine; end-to-end tests the real runner on
the demo model, against the local backend's answers."""

from __future__ import annotations

import http.server
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import replace
from pathlib import Path

import pytest

from fake_engine import Fake
from ggbatch.runner.errors import ConfigError
from ggbatch.runner.pool.pool import WorkerPool
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
from ggbatch.workers.spec import WorkerSpec
from helpers import JOURNAL_HEAD, ggbatch_command, journaled, wait_for
from helpers import ggbatch as cli

ray = pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance for the module. Its workers import the tests' fake engine: the
    raylet and its workers inherit this process's environment."""
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tests"), path) if p)
    # "local": an instance of its own even where `ray start` runs here, or has left its address file
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    os.environ["PYTHONPATH"] = path


def ray_specs(n_workers, fake=Fake(), slots=4):
    from ggbatch.runner.pool.ray import RayBackend

    backend = RayBackend(None)  # joins the module's instance
    node = backend.nodes()[0]
    engine = EngineConfig(model_path="fake.gguf", n_threads=1, slots=slots, n_ctx_seq=64, n_batch=64,
                          generation=GenerationParams())
    specs = [WorkerSpec(i, (i,), "fake.gguf", engine_factory=fake, node_id=node.node_id, node_ip=node.ip)
             for i in range(n_workers)]
    return backend, specs, engine


def qs(n):
    return [Question(f"q{i}", array("i", range(i % 7 + 1)), i) for i in range(n)]


def run_pool(n_workers, fake, n_questions):
    backend, specs, engine = ray_specs(n_workers, fake)
    seen = []
    pool = WorkerPool(specs, on_answers=lambda answers: seen.extend(a.qid for a in answers), backend=backend)
    return pool, pool.run(qs(n_questions), engine), seen


# -- pure parts ---------------------------------------------------------------------------------


# -- the pool on Ray actors, with the fake engine -----------------------------------------------


def test_every_question_answered_exactly_once_on_ray_actors(cluster):
    pool, answers, seen = run_pool(2, Fake(), 300)
    assert sorted(seen) == sorted(f"q{i}" for i in range(300))
    assert answers["q5"].text == "answer to q5 (6 tokens)"
    assert all(run.node and run.node["ip"] for run in pool.worker_runs())


def test_dead_actor_questions_go_back_and_it_is_restarted(cluster, tmp_path):
    marker = tmp_path / "died"  # the actor's process calls os._exit(3) after 5 answers, once
    pool, answers, seen = run_pool(2, Fake(exit_after=5, marker=str(marker)), 100)
    assert marker.exists()
    assert sorted(seen) == sorted(f"q{i}" for i in range(100))  # nothing lost, nothing twice
    assert sum(w.restarts for w in pool.workers) >= 1
    assert all(a.error is None for a in answers.values())


def test_question_that_keeps_killing_actors_is_failed_by_the_same_crash_budget(cluster):
    pool, answers, _ = run_pool(2, Fake(segv_on="q3"), 20)
    assert answers["q3"].error.startswith("a worker died 2 times while answering it alone (last: Ray actor died")
    assert all(answers[f"q{i}"].error is None for i in range(20) if i != 3)


def test_actor_pins_itself_and_overrides_omp_num_threads(cluster):
    from ggbatch.runner.pool.ray import RayBackend
    from ggbatch.workers.ray_actor import RayWorker

    node = RayBackend(None).nodes()[0]
    # Two threads on one reserved CPU, so Ray's OMP_NUM_THREADS (1, from num_cpus) is not ours.
    spec = WorkerSpec(0, (0, 1), "fake.gguf", engine_factory=Fake(), node_id=node.node_id, node_ip=node.ip)
    # the coordinator's niceness, as RayLink gives it (a suite run under `nice` too)
    actor = ray.remote(RayWorker).options(num_cpus=1).remote(spec, os.getpriority(os.PRIO_PROCESS, 0))
    try:
        pid, cores, omp, nice = ray.get(actor.where.remote())
        assert cores == tuple(sorted(os.sched_getaffinity(0)))[:2]
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        assert {tuple(sorted(os.sched_getaffinity(tid))) for tid in tids} == {cores}
        if os.geteuid() == 0:  # only a privileged process may lower its niceness from Ray's 15
            assert nice == os.getpriority(os.PRIO_PROCESS, 0)
            assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in tids} == {nice}
        assert omp == "2"  # what llama.cpp's OpenMP will read

        @ray.remote(num_cpus=1)
        class Plain:  # what Ray itself sets for an actor holding one CPU
            def omp(self):
                return os.environ.get("OMP_NUM_THREADS")

        assert ray.get(Plain.remote().omp.remote()) == "1"
    finally:
        ray.kill(actor)


# -- end to end on the demo model ---------------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_ray_backend_answers_as_the_local_backend(cluster, demo_model, questions_file, tmp_path):
    from ggbatch.runner.cli import main

    q = questions_file(24)
    common = ["run", "--model", demo_model, "--input", q, "--max-tokens", "48", "--batch-invariant",
              "--progress", "off", "-q", "--slots", "8"]
    assert main([*common, "--output", str(tmp_path / "local.json")]) == 0
    assert main([*common, "--output", str(tmp_path / "ray.json"), "--backend", "ray",
                 "--report", str(tmp_path / "report.json")]) == 0
    assert (tmp_path / "ray.json").read_bytes() == (tmp_path / "local.json").read_bytes()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["layout"]["backend"] == "ray"
    assert report["layout"]["nodes"][0]["cpus"] == 2
    worker = report["workers"]["0"]
    assert worker["node"]["node_id"] == report["layout"]["nodes"][0]["node_id"]
    assert worker["llama_n_threads"] == 2 and worker["questions"] == 24


def _kill_one_actor_when(journal: Path, min_answers: int, killed: list) -> None:
    """Wait until the run has journaled some answers, then ray.kill one of its workers."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if journal.exists() and len(journal.read_text().splitlines()) >= JOURNAL_HEAD + min_answers:
            actors = [a for a in ray.util.list_named_actors(all_namespaces=True)
                      if a["name"].startswith("ggbatch-worker-")]
            if actors:
                ray.kill(ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"]))
                killed.append(actors[0]["name"])
                return
        time.sleep(0.05)


@pytest.mark.model
@pytest.mark.slow
def test_ray_kill_of_an_actor_mid_job_loses_nothing(cluster, demo_model, questions_file, tmp_path):
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    killed: list = []
    killer = threading.Thread(target=_kill_one_actor_when, args=(tmp_path / "a.json.journal.jsonl", 3, killed))
    killer.start()
    done = cli("run", "--model", demo_model, "--input", questions_file(48), "--output", str(out), "--max-tokens", "48",
               "--workers", "2", "--slots", "4", "--batch-invariant", "--progress", "off", "--report", str(report),
               "--backend", "ray", "--ray-address", cluster)
    killer.join()
    assert done.returncode == 0, done.stderr
    assert killed, "the job ended before an actor could be killed"
    rows = json.loads(out.read_text())
    assert len(rows) == 48 and all(r["answer"] is not None for r in rows)
    journaled_ids = [e["qid"] for e in journaled(tmp_path / "a.json.journal.jsonl")]
    assert sorted(journaled_ids) == sorted(r["questionID"] for r in rows)  # each once: nothing twice
    assert sum(w["restarts"] for w in json.loads(report.read_text())["workers"].values()) == 1
    assert "died (Ray actor died" in done.stderr


@pytest.mark.model
@pytest.mark.slow
def test_sigterm_on_a_ray_run_exits_143_with_the_answers_written(cluster, demo_model, questions_file, tmp_path):
    """ray.init puts in its own SIGTERM handler (exit 15, no answers file): the run's is put back."""
    out = tmp_path / "a.json"
    proc = subprocess.Popen(ggbatch_command("run", "--model", demo_model, "--input", questions_file(200), "--output",
                                            out, "--max-tokens", "64", "--slots", "2", "--progress", "off",
                                            "--backend", "ray", "--ray-address", cluster),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        journal = tmp_path / "a.json.journal.jsonl"
        wait_for(lambda: journal.exists() and len(journal.read_text().splitlines()) >= JOURNAL_HEAD + 2,
                 timeout=90, what="some answers")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert "stopped by signal 15" in stderr and "SIGTERM received" not in stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 200 and sum(r["answer"] is not None for r in rows) >= 2


@pytest.mark.slow
def test_a_bad_ray_address_is_one_line_and_exit_2(tmp_path, demo_model):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"questionID": "q1", "question": "Hi?"}) + "\n")
    done = cli("run", "--model", demo_model, "--input", str(q), "--output", str(tmp_path / "a.json"),
               "--backend", "ray", "--ray-address", "127.0.0.1:1", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ggbatch: error: ray_address 127.0.0.1:1: cannot connect (Connection refused); is a Ray head "
        "running there (`ray start --head`)?"]
    assert not (tmp_path / "a.json").exists()


def _one_question(tmp_path: Path) -> str:
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"questionID": "q1", "question": "Hi?"}) + "\n")
    return str(q)


@pytest.mark.parametrize("given", ["RAY_ADDRESS", "ray_current_cluster"])
def test_auto_resolving_to_a_dead_address_is_one_line_and_exit_2_in_seconds(given, tmp_path, demo_model):
    """`auto` is resolved as ray.init resolves it, then checked as an address given is: ray.init
    alone would retry it for minutes. The address file is in a Ray folder of the test's own."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path)
    if given == "RAY_ADDRESS":
        env["RAY_ADDRESS"] = "127.0.0.1:1"
    else:
        from ray._private.services import find_gcs_addresses
        if find_gcs_addresses():  # for auto, Ray prefers one running here (this module's own) to the file
            pytest.skip("a Ray cluster runs on this machine")
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
    started = time.monotonic()
    done = cli("run", "--model", demo_model, "--input", _one_question(tmp_path), "--output", str(tmp_path / "a.json"),
               "--backend", "ray", "--ray-address", "auto", env=env, timeout=60)
    assert done.returncode == 2 and time.monotonic() - started < 20
    [line] = done.stderr.strip().splitlines()
    # named as the user set it (Ray's helper turns 127.0.0.1 into this machine's address)
    source = "RAY_ADDRESS=127.0.0.1:1" if given == "RAY_ADDRESS" else \
        f"{tmp_path / 'ray' / 'ray_current_cluster'}, which holds 127.0.0.1:1"
    assert line.startswith(f"ggbatch: error: ray_address auto ({source}") and ":1): cannot connect" in line, line
    assert not (tmp_path / "a.json").exists()


@pytest.mark.parametrize("given,said", [
    ("", "no Ray cluster to join: none runs on this machine and RAY_ADDRESS names none; start one (`ray start "
         "--head`), give ray_address (--ray-address) as HOST:PORT, or leave it out"),  # not Ray's `--address` flag
    ("notahost:abc", "RAY_ADDRESS 'notahost:abc' is not HOST:PORT (a Ray head's GCS address"),
    ("ray://127.0.0.1:10001", "RAY_ADDRESS 'ray://127.0.0.1:10001' is a Ray Client (ray://) address, which ggbatch "
                              "does not join")])
def test_auto_with_a_ray_address_it_cannot_join_names_ray_address(given, said, tmp_path, demo_model):
    """They were `must be auto or HOST:PORT ..., got 'auto (notahost:abc, from RAY_ADDRESS)'`, to a
    user who gave auto, and Ray's `Invalid address format: ray://...`, naming no RAY_ADDRESS."""
    env = {**os.environ, "RAY_ADDRESS": given, "RAY_TMPDIR": str(tmp_path)}
    from ray._private.services import find_gcs_addresses
    if not given and find_gcs_addresses():  # auto would join it
        pytest.skip("a Ray cluster runs on this machine")
    done = cli("run", "--model", demo_model, "--input", _one_question(tmp_path), "--output", str(tmp_path / "a.json"),
               "--backend", "ray", "--ray-address", "auto", env=env, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"ggbatch: error: ray_address auto: {said}"), line


def test_an_address_where_another_server_answers_is_one_line_and_exit_2_in_seconds(tmp_path, demo_model):
    """An HTTP server (the dashboard's port, a typo) accepts the connection: ray.init would retry
    it for minutes, printing Ray's C++ warnings."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        started = time.monotonic()
        done = cli("run", "--model", demo_model, "--input", _one_question(tmp_path), "--output",
                   str(tmp_path / "a.json"), "--backend", "ray", "--ray-address", address, timeout=60)
        took = time.monotonic() - started
    finally:
        server.shutdown()
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"ggbatch: error: ray_address {address}: another server answers there (")
    assert "not a Ray head; give the GCS address `ray start --head` prints" in done.stderr
    assert took < 20 and not (tmp_path / "a.json").exists()


def test_a_grpc_server_that_is_not_the_gcs_is_refused_and_the_gcs_is_not(cluster, capfd):
    """A raylet's port speaks gRPC, as the GCS does, but knows none of the GCS's services."""
    from ggbatch.runner.pool.ray_address import check_address

    node = ray.nodes()[0]
    raylet = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
    with pytest.raises(ConfigError) as refused:
        check_address(raylet)
    assert str(refused.value) == (
        f"ray_address {raylet}: a gRPC server answers there, but not a Ray head's GCS (it has no GCS service: "
        "gRPC status 12, UNIMPLEMENTED); give the GCS address `ray start --head` prints (HOST:6379 by default), "
        "not the dashboard's or another port")
    assert "gcs_client" not in capfd.readouterr().err  # Ray's C++ warning is taken aside
    check_address(cluster)  # the GCS itself passes


@pytest.fixture
def ray_start(tmp_path):
    """A cluster `ray start --head` runs on this machine, in a Ray folder of its own (RAY_TMPDIR:
    its address file is where ray.init(None) looks); SIGTERM to `ray start --block` stops it all."""
    folder = tempfile.mkdtemp(prefix="ggr", dir="/tmp")  # short: Ray's socket paths are under it
    env = {**os.environ, "RAY_TMPDIR": folder, "RAY_AUTH_MODE": "disabled"}  # whatever ~/.ray holds
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--port", "0",
                             "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats", "--block"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address_file = Path(folder) / "ray" / "ray_current_cluster"
    try:
        # Ray makes the file, then writes it: on a loaded machine it was once read empty between the two
        address = wait_for(lambda: address_file.exists() and address_file.read_text().strip(), timeout=90,
                           what="`ray start --head` to write its address")
        yield env, address
    finally:
        head.terminate()
        head.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="tells the instances apart by their CPUs")
def test_no_address_starts_an_instance_of_its_own_beside_a_running_cluster(ray_start, tmp_path, demo_model):
    env, running = ray_start
    done = cli("run", "--model", demo_model, "--input", _one_question(tmp_path), "--output", str(tmp_path / "a.json"),
               "--report", str(tmp_path / "r.json"), "--max-tokens", "4", "--progress", "off", "--backend", "ray",
               env=env, timeout=150)
    assert done.returncode == 0, done.stderr
    from ggbatch.runner.plan.layout import usable_cores
    from ggbatch.runner.pool.ray_address import check_address

    nodes = json.loads((tmp_path / "r.json").read_text())["layout"]["nodes"]
    assert [node["cpus"] for node in nodes] == [len(usable_cores())]  # not the running cluster's 1 CPU
    check_address(running)  # which is still there, left as it was


def test_node_plan_numbers_workers_across_nodes_and_keeps_their_ids_when_a_node_keeps_fewer():
    from dataclasses import replace

    from ggbatch.runner.plan.layout import plan_layout
    from ggbatch.runner.plan.nodes import Node, NodePlan, share

    small, big = Node("a" * 56, "10.0.0.1", tuple(range(2))), Node("b" * 56, "10.0.0.2", tuple(range(16)))
    plan = NodePlan.of([small, big], [plan_layout(small.cores, threads=2, n_questions=100),
                                      plan_layout(big.cores, threads=2, n_questions=100)])
    assert plan.first_ids == (0, 1) and plan.node_of() == {0: 0, **{i: 1 for i in range(1, 9)}}
    fewer = replace(plan, layouts=(plan.layouts[0], replace(plan.layouts[1], workers=3)))
    assert fewer.node_of() == {0: 0, 1: 1, 2: 1, 3: 1}  # the big node's memory plan kept 3 of its 8
    whole = plan.whole()
    assert whole.workers == 9 and whole.cores[0] == (0, 1) and whole.cores[-1] == (14, 15)
    assert (share(180, small, [small, big]), share(180, big, [small, big])) == (20, 160)


def test_workers_a_node_puts_on_the_same_cores_are_said_to_share_them(cluster, caplog):
    """`ray start --num-cpus` above a node's cores: workers planned on positions past its usable
    cores wrap round onto cores another worker runs on, where their threads contend, without a word."""
    backend, specs, engine = ray_specs(2, Fake(slow=0.02))  # both ready before the questions run out
    usable = len(os.sched_getaffinity(0))  # the actors' too: they run on this machine
    specs = [replace(specs[0], cores=(0,)), replace(specs[1], cores=(usable,))]  # position `usable` wraps to core 0
    caplog.set_level(logging.WARNING, logger="ggbatch")
    pool = WorkerPool(specs, backend=backend)
    assert len(pool.run(qs(200), engine)) == 200
    said = [r.getMessage() for r in caplog.records if "Ray counts more CPUs" in r.getMessage()]
    assert len(said) == 1 and "with other workers" in said[0], said

    caplog.clear()  # positions apart on cores apart: nothing to say
    run_pool(2, Fake(), 20)
    assert not [r for r in caplog.records if "Ray counts more CPUs" in r.getMessage()]


def test_a_worker_runs_no_more_threads_than_the_cores_its_positions_wrap_onto(cluster):
    """Four threads planned on a 2-core node that Ray counts as 4 CPUs ran four llama.cpp threads
    on two cores (OMP_NUM_THREADS said 2)."""
    backend, specs, engine = ray_specs(1)
    usable = len(os.sched_getaffinity(0))
    readies = []
    pool = WorkerPool([replace(specs[0], cores=(0, usable))], backend=backend,  # both positions: core 0
                      on_ready=lambda _, msg: readies.append(msg))
    assert len(pool.run(qs(10), replace(engine, n_threads=2))) == 10
    assert [(r.cores, r.n_threads) for r in readies] == [((0,), 1)]
