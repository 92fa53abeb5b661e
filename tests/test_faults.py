"""Nothing lost: the real runner on a real model, killed, stopped, run twice at once, rerun with
other settings, and short of disk. Bad input files and flags: tests/test_bad_inputs.py.
Every run here has a hard timeout; a hang is a failure."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from helpers import JOURNAL_HEAD, ggbatch_command, journal_entries, journaled, wait_for, write_jsonl, write_questions

pytestmark = [pytest.mark.timeout(180), pytest.mark.model, pytest.mark.slow]

N_QUESTIONS, MAX_TOKENS = 64, 64
LONG_QUESTIONS = 6 * N_QUESTIONS  # eight kills with progress between them, on the fast demo model


def cmd(model, questions, out, *extra, slots=4):
    # batch-invariant: answers do not depend on batch composition, so a resumed or disturbed run
    # must give byte-identical output. 4 slots per worker: most questions are still waiting when
    # a test strikes, so the job cannot finish in the same instant.
    return ggbatch_command("run", "--model", model, "--input", questions, "--output", out, "--workers", 2,
                           "--slots", slots, "--max-tokens", MAX_TOKENS, "--batch-invariant", "--progress", "log",
                           *extra)


def answers_by_worker(out) -> dict[int, int]:
    path = Path(f"{out}.journal.jsonl")
    counts = {0: 0, 1: 0}
    for line in (path.read_text().splitlines()[1:] if path.exists() else []):
        try:
            counts[json.loads(line)["worker_id"]] += 1
        except (ValueError, KeyError):
            pass  # a line being written
    return counts


def workers_of(proc):
    """The coordinator's worker processes (not its tokenizer process, which names itself)."""
    try:
        return [c for c in psutil.Process(proc.pid).children()
                if any("spawn_main" in part for part in c.cmdline()) and not c.name().startswith("ggbatch-tok")]
    except psutil.NoSuchProcess:
        return []


def kill_worker(worker: psutil.Process) -> None:
    """SIGKILL, then wait until it is dead: a worker still dying is listed by workers_of, and a
    second kill of it would count as a second death that the coordinator never sees."""
    worker.send_signal(signal.SIGKILL)

    def dead() -> bool:
        try:
            return worker.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    wait_for(dead, timeout=10, what=f"worker {worker.pid} to die")


def quiet_run(folder, n_questions, model):
    """An uninterrupted run: (model, questions, the bytes every disturbed run must reproduce)."""
    questions = write_questions(folder / "q.jsonl", n_questions)
    out = folder / "answers.json"
    r = subprocess.run(cmd(model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return model, questions, out.read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_model):
    return quiet_run(tmp_path_factory.mktemp("reference"), N_QUESTIONS, demo_model)


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory, demo_model):
    """Long enough for eight kills with progress between them."""
    return quiet_run(tmp_path_factory.mktemp("long_reference"), LONG_QUESTIONS, demo_model)


def test_kill_9_of_the_coordinator_then_rerun_gives_identical_output(reference, tmp_path):
    model, questions, expected = reference
    out = tmp_path / "answers.json"
    temp = tmp_path / "temp"  # the runs' temporary folder: where their worker logs go
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(cmd(model, questions, out), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    wait_for(lambda: journal_entries(out) >= 8, what="some journaled answers")
    workers = workers_of(proc)
    proc.kill()
    proc.wait(10)
    # The workers die with their coordinator (PR_SET_PDEATHSIG): nothing left holding cores.
    gone, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive
    assert not out.exists()
    done_before = journal_entries(out)
    assert 0 < done_before < N_QUESTIONS
    assert [p.name.startswith(f"ggbatch-workers-{proc.pid}-") for p in temp.iterdir()] == [True]
    r = subprocess.run(cmd(model, questions, out, "--report", tmp_path / "r.json"), cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == expected
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["questions"]["from_journal"] >= done_before - 1  # a torn last line is redone
    assert list(temp.iterdir()) == []  # the killed run's worker logs went with the rerun, and the rerun's own


def test_sigterm_stops_within_5_seconds_and_the_rerun_completes(reference, tmp_path):
    model, questions, expected = reference
    out, report = tmp_path / "answers.json", tmp_path / "r.json"
    proc = subprocess.Popen(cmd(model, questions, out, "--report", report), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_entries(out) >= 4, what="some journaled answers")
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert time.time() - t0 < 5.0
    assert proc.returncode == 143
    assert "stopped by signal 15" in stderr and "Traceback" not in stderr
    lines = Path(f"{out}.journal.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every line whole: the journal is valid
    # The answers file holds what was answered and marks the rest.
    rows = json.loads(out.read_text())
    assert len(rows) == N_QUESTIONS and sum(r["answer"] is not None for r in rows) >= 4
    assert all(r["error"] == "not answered: the run was stopped by signal 15 first" for r in rows
               if r["answer"] is None)
    # the timeline ends with the run, as a finished run's does (it stopped at its last 2 s sample)
    stopped = json.loads(report.read_text())
    end = stopped["timeline"][-1]
    assert end["done"] == stopped["questions"]["answered"] + stopped["questions"]["failed"]
    assert end["generated_tokens"] >= stopped["tokens"]["generated"]
    r = subprocess.run(cmd(model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == expected


STUCK_JOB = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from fake_engine import Fake
from ggbatch import build_config, run_job
from ggbatch.runner.errors import Interrupted

if __name__ == "__main__":
    config = build_config([("t", {{"model": {model!r}, "input": {questions!r}, "output": {out!r}, "workers": 2}})])
    try:
        run_job(config, engine_factory=Fake(slow=60, started={started!r}), progress="log")
    except Interrupted as exc:
        sys.exit(exc.exit_code)
"""


@pytest.mark.parametrize("signals, seconds", [(1, (1.8, 5.0)), (2, (0.0, 1.0))])
def test_one_signal_gives_a_grace_and_a_second_stops_at_once(tmp_path, demo_model, signals, seconds):
    # Every engine step takes 60 s, so questions in flight never finish: one signal waits out the
    # 2 s grace before stopping the workers, a second one stops them at once.
    questions = tmp_path / "q.jsonl"
    write_jsonl(questions, [{"questionID": f"q{i}", "question": "Hi?"} for i in range(8)])
    script = tmp_path / "job.py"
    started = tmp_path / "started"
    script.write_text(STUCK_JOB.format(root=str(ROOT), tests=str(ROOT / "tests"), model=demo_model,
                                       questions=str(questions), out=str(tmp_path / "a.json"),
                                       started=str(started)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for(lambda: len(workers_of(proc)) == 2, what="two workers")
    wait_for(started.exists, what="a worker's (stuck) first step with questions in it")
    workers = workers_of(proc)
    for i in range(signals):
        if i:
            time.sleep(0.3)  # two signals sent at once would merge into one pending signal
        proc.send_signal(signal.SIGINT)
    t0 = time.time()  # from the last signal
    _, stderr = proc.communicate(timeout=15)
    assert seconds[0] <= time.time() - t0 < seconds[1]
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive


def test_workers_killed_at_random_moments_lose_and_duplicate_nothing(long_reference, tmp_path):
    model, questions, expected = long_reference
    out = tmp_path / "answers.json"
    proc = subprocess.Popen(cmd(model, questions, out), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    rng = random.Random(7)
    kills = 0
    for _ in range(8):  # more than any per-worker restart budget would survive
        # Kills between answers: each after some progress, as crashes spread over a long job are.
        # (Three kills of the one worker retrying a suspect would rightly fail that question.)
        before = answers_by_worker(out)
        wait_for(lambda before=before: (len(workers_of(proc)) == 2
                                        and all(answers_by_worker(out)[w] > before[w] for w in (0, 1)))
                 or proc.poll() is not None, what="two live workers, each with a new answer")
        time.sleep(rng.uniform(0.0, 0.2))
        victims = workers_of(proc)
        if proc.poll() is not None or not victims:
            break
        kill_worker(rng.choice(victims))
        kills += 1
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert kills >= 6, "the job finished before the workers could be killed: make it longer"
    assert stderr.count("died (signal 9)") == kills
    assert out.read_bytes() == expected
    ids = [e["qid"] for e in journaled(f"{out}.journal.jsonl")]
    assert len(ids) == len(set(ids)) == LONG_QUESTIONS  # each answer journaled exactly once


KQ_QUESTIONS, KQ_SLOTS = 160, 16
def kq_cmd(model, questions, out):
    # 16 slots per worker: the quiet run decodes 8 or more sequences a step, where llama.cpp
    # multiplies K-quant weights with another kernel than for one sequence alone.
    return cmd(model, questions, out, slots=KQ_SLOTS)


@pytest.fixture(scope="module")
def k_quant_reference(tmp_path_factory, k_quant_model):
    """An uninterrupted --batch-invariant run of a K-quant model (see conftest.k_quant_model)."""
    folder = tmp_path_factory.mktemp("kq-reference")
    questions = write_questions(folder / "q.jsonl", KQ_QUESTIONS)
    out = folder / "answers.json"
    r = subprocess.run(kq_cmd(k_quant_model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return k_quant_model, questions, out.read_bytes()


@pytest.mark.timeout(240)
def test_batch_invariant_answers_retried_alone_after_kill_9_equal_a_quiet_run(k_quant_reference, tmp_path):
    # Every kill sends the worker's questions back as suspects, each retried alone on a worker:
    # the batch of one. Before batch-invariant batches were laid out (workers/engine/invariant.py),
    # a sixth of this model's answers changed when decoded alone.
    # Each worker writes to a results pipe of its own (runner/pool/pool.py), so a kill at any moment,
    # in the middle of a message included, cannot block the other worker.
    model, questions, expected = k_quant_reference
    out = tmp_path / "answers.json"
    proc = subprocess.Popen(kq_cmd(model, questions, out), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    kills = 0
    try:
        # Spread over the first half of the job, so every kill lands while questions are left.
        for share in (0.1, 0.2, 0.35, 0.5):
            wait_for(lambda: len(workers_of(proc)) == 2 or proc.poll() is not None, what="two live workers")
            wait_for(lambda share=share: journal_entries(out) >= share * KQ_QUESTIONS or proc.poll() is not None,
                     what="answers")
            victims = sorted(workers_of(proc), key=lambda w: w.create_time())
            if proc.poll() is not None or not victims:
                break
            kill_worker(victims[0])
            kills += 1
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()  # its workers die with it (PR_SET_PDEATHSIG)
            proc.wait(10)
    assert proc.returncode == 0, stderr
    assert kills >= 3, "the job finished before the workers could be killed: make it longer"
    assert stderr.count("died (signal 9)") == kills
    assert out.read_bytes() == expected


def test_a_second_run_on_the_same_output_is_refused(reference, tmp_path):
    model, questions, _ = reference
    out = tmp_path / "answers.json"
    first = subprocess.Popen(cmd(model, questions, out), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: Path(f"{out}.lock").exists(), what="the first run's lock")
        second = subprocess.run(cmd(model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert f"another ggbatch run (pid {first.pid}) is writing this output" in second.stderr
    finally:
        first.kill()
        first.wait(10)


def test_changed_setting_refuses_the_journal_until_fresh(reference, tmp_path):
    model, questions, _ = reference
    out = tmp_path / "answers.json"
    base = ggbatch_command("run", "--model", str(model), "--input", str(questions),
                           "--output", str(out), "--max-tokens", "8")
    assert subprocess.run(base, cwd=ROOT, capture_output=True, timeout=120).returncode == 0
    r = subprocess.run([*base, "--temperature", "0.5"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "'sampling.temperature' changed since the journaled run (0.0 -> 0.5)" in r.stderr
    r = subprocess.run([*base, "--temperature", "0.5", "--fresh"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def tiny_disk(tmp_path):
    """A 24 KiB filesystem, to fill up. Needs root (mount); skipped otherwise."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(folder)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here to fill: {r.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], capture_output=True)


def test_disk_full_is_exit_2_and_the_journal_keeps_what_was_answered(reference, tiny_disk, tmp_path):
    model, questions, expected = reference
    out = tiny_disk / "answers.json"
    r = subprocess.run(cmd(model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    # The error line (a resource-tracker warning at exit may come after it, so not "the last line")
    errors = [line for line in r.stderr.splitlines() if line.startswith("ggbatch: error: ")]
    assert len(errors) == 1 and "No space left on device" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    journal = Path(f"{out}.journal.jsonl").read_text().splitlines()
    kept = [json.loads(line) for line in journal[JOURNAL_HEAD:] if line.endswith("}")]
    assert kept  # some answers made it to disk before it filled
    # With room again (the same files moved to a bigger disk), the rerun finishes the job.
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    Path(f"{roomy / 'answers.json'}.journal.jsonl").write_bytes(Path(f"{out}.journal.jsonl").read_bytes())
    r = subprocess.run(cmd(model, questions, roomy / "answers.json", "--report", tmp_path / "r.json"),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (roomy / "answers.json").read_bytes() == expected
    assert json.loads((tmp_path / "r.json").read_text())["questions"]["from_journal"] >= len(kept) - 1


def test_read_only_output_folder_is_exit_2_before_any_work(tmp_path, demo_model):
    """Root may write anywhere, except on a read-only filesystem: mount one (skipped without mount)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {r.stderr.decode().strip()}")
    try:
        questions = tmp_path / "q.jsonl"
        questions.write_text('{"questionID": "a", "question": "Hi?"}\n')
        r = subprocess.run(cmd(demo_model, questions, folder / "answers.json"), cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2
        assert r.stderr.strip().splitlines() == [f"ggbatch: error: {folder / 'answers.json'}: the folder of the "
                                                 f"answers file (output), {folder}, is not writable: Read-only file "
                                                 "system"]
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def _file_size_limit(limit):
    """For the child: writes past `limit` bytes fail with EFBIG (Python ignores SIGXFSZ)."""
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_journal_that_cannot_grow_ends_the_run_with_the_answers_file_written(reference, tmp_path):
    """ulimit -f: the journal (a long line per answer) reaches the limit first; the answers file
    (a short row each) still fits. The run ends as a stop does: every journaled answer written,
    the others marked, and the next run finishes the job."""
    model, questions, expected = reference
    out = tmp_path / "answers.json"
    r = subprocess.run(cmd(model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=120,
                       preexec_fn=_file_size_limit(12 * 1024))
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("ggbatch: error: ")]
    assert len(errors) == 1 and "cannot append to the journal (File too large)" in errors[0], r.stderr
    assert "run the same command again to finish" in errors[0] and "Traceback" not in r.stderr
    rows = json.loads(out.read_text())
    answered = [row for row in rows if row["answer"] is not None]
    assert len(rows) == N_QUESTIONS and 0 < len(answered) < N_QUESTIONS
    assert {row["error"] for row in rows if row["answer"] is None} == {"not answered: the journal could not take "
                                                                       "more answers"}
    r = subprocess.run(cmd(model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == expected


def test_a_journal_cut_short_during_the_run_ends_it_in_one_line_and_the_rerun_finishes(reference, tmp_path):
    model, questions, expected = reference
    out = tmp_path / "answers.json"
    journal = Path(f"{out}.journal.jsonl")
    proc = subprocess.Popen(cmd(model, questions, out, slots=1), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_entries(out) >= 2, timeout=120, what="two journaled answers")
    os.truncate(journal, 0)  # another program empties it
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert "the journal was cut short or written to by another program during the run" in stderr
    assert "Traceback" not in stderr
    assert len(json.loads(out.read_text())) == N_QUESTIONS
    r = subprocess.run(cmd(model, questions, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == expected
