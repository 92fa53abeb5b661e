"""What a run's surroundings do to it (cron jobs, closed terminals, pipelines): its current folder
removed, its terminal hung up, its question file cut short under it, standard input closed. Each
is a clear line and a known exit code, never a traceback, and a run that was answering writes its
answers file. Every run here has a hard timeout."""

from __future__ import annotations

import json
import os
import pty
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from helpers import ggbatch_command, journal_entries, wait_for, write_questions

pytestmark = [pytest.mark.timeout(180), pytest.mark.model]


def _in_folder(folder: Path, *args: object) -> list[str]:
    """The command line of ggbatch ARGS started in `folder`, which the test may then remove."""
    return ["sh", "-c", f"cd {shlex.quote(str(folder))} && exec {shlex.join(ggbatch_command(*args))}"]


def _workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The run's worker processes (not its tokenizer process, which names itself)."""
    try:
        return [c for c in psutil.Process(proc.pid).children()
                if any("spawn_main" in part for part in c.cmdline()) and not c.name().startswith("ggbatch-tok")]
    except psutil.NoSuchProcess:
        return []


def test_a_run_started_in_a_removed_folder_is_one_line_and_exit_2(tmp_path, demo_model):
    gone = tmp_path / "gone"
    gone.mkdir()
    questions = write_questions(tmp_path / "q.jsonl", 4)
    shell = (f"cd {shlex.quote(str(gone))} && rmdir {shlex.quote(str(gone))} && exec "
             + shlex.join(ggbatch_command("run", "--model", demo_model, "--input", questions,
                                          "--output", tmp_path / "a.jsonl", "--max-tokens", 4)))
    r = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "ggbatch: error: the current folder no longer exists (it was removed or moved away): cd to a folder "
        "that exists and run again"]
    assert not (tmp_path / "a.jsonl").exists()


@pytest.mark.slow
def test_a_worker_restarted_after_the_current_folder_went_finishes_the_run(tmp_path, demo_model):
    # the model named relative to the folder that goes: the workers are given its absolute path
    (tmp_path / "m.gguf").symlink_to(demo_model)
    questions = write_questions(tmp_path / "q.jsonl", 60)
    folder, out = tmp_path / "wd", tmp_path / "a.jsonl"
    folder.mkdir()
    proc = subprocess.Popen(_in_folder(folder, "run", "--model", "../m.gguf", "--input", questions, "--output", out,
                                       "--max-tokens", 32, "--workers", 1, "--slots", 1, "--threads", 1,
                                       "--progress", "log"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: journal_entries(out) >= 2, 120, "two journaled answers")
        folder.rmdir()
        (worker,) = _workers(proc)
        worker.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "worker 0 died (signal 9)" in stderr
    assert len(out.read_text().splitlines()) == 60


def _slow_run(tmp_path: Path, model: str, **popen: object) -> tuple[subprocess.Popen, Path]:
    """A run of 60 questions one at a time, in a process group of its own (a shell's job), once
    it has journaled two answers."""
    questions, out = write_questions(tmp_path / "q.jsonl", 60), tmp_path / "a.jsonl"
    # SIGHUP at its default, as a terminal's shell starts a job: a test suite run under nohup would
    # pass its own ignored SIGHUP on, which the run keeps ignored
    popen.setdefault("preexec_fn", lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    proc = subprocess.Popen(ggbatch_command("run", "--model", model, "--input", questions, "--output", out,
                                            "--max-tokens", 32, "--workers", 1, "--slots", 1, "--threads", 1,
                                            "--progress", "log"),
                            start_new_session=True, **popen)
    wait_for(lambda: journal_entries(out) >= 2, 120, "two journaled answers")
    return proc, out


def _hung_up(proc: subprocess.Popen, timeout: float) -> str:
    """SIGHUP to the run's whole process group, as a closed terminal's shell sends it to its job,
    workers included; the run's stderr once it has ended."""
    try:
        os.killpg(proc.pid, signal.SIGHUP)
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return stderr


@pytest.mark.slow
def test_sighup_to_the_job_writes_the_answers_file_and_exits_129(tmp_path, demo_model):
    proc, out = _slow_run(tmp_path, demo_model, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = _hung_up(proc, 30)
    assert proc.returncode == 129, stderr
    assert "ggbatch: stopped by signal 1; the answers so far are in" in stderr and "Traceback" not in stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 60 and sum(row["answer"] is not None for row in rows) >= 2
    assert all(row["error"] == "not answered: the run was stopped by signal 1 first" for row in rows
               if row["answer"] is None)


@pytest.mark.slow
def test_sighup_with_the_terminal_gone_still_writes_the_answers_file(tmp_path, demo_model):
    # an ssh session closed: the run's terminal hung up, so every line it writes fails (EIO)
    terminal, its_side = pty.openpty()
    proc, out = _slow_run(tmp_path, demo_model, stdin=its_side, stdout=its_side, stderr=its_side)
    os.close(its_side)
    try:
        os.close(terminal)
        os.killpg(proc.pid, signal.SIGHUP)
        assert proc.wait(timeout=30) == 129
    finally:
        proc.kill()
    assert len(out.read_text().splitlines()) == 60


@pytest.mark.slow
def test_a_sighup_ignored_as_the_run_starts_stays_ignored(tmp_path, demo_model):
    # nohup: the run goes on to its end
    proc, out = _slow_run(tmp_path, demo_model, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    stderr = _hung_up(proc, 150)
    assert proc.returncode == 0, stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 60 and all(row["answer"] is not None for row in rows)


def test_questions_from_a_closed_standard_input_are_refused_before_any_worker_starts(tmp_path, demo_model):
    out = tmp_path / "a.jsonl"
    command = shlex.join(ggbatch_command("run", "--model", demo_model, "--input", "-", "--output", out))
    r = subprocess.run(["sh", "-c", f"exec {command} <&-"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "ggbatch: error: <stdin>: standard input is closed; pipe the questions in (cat questions.jsonl | "
        "ggbatch run --input - ...) or give --input a file"]
    assert r.stdout == "" and not out.exists() and list(tmp_path.iterdir()) == []


TERMINAL_AS_INPUT = """
import os, sys
from ggbatch.runner.errors import InputError
from ggbatch.runner.files.piped import readable_input
try:
    with readable_input(sys.argv[1], sys.argv[2]):
        pass
except InputError as exc:
    print(exc)
with open("/proc/self/stat") as f:
    print(f.read().rsplit(")", 1)[1].split()[4])  # tty_nr: its controlling terminal, 0 for none
"""


@pytest.mark.timeout(60)
def test_a_terminal_given_as_input_to_a_session_leader_does_not_become_its_terminal(tmp_path):
    """A run leading its own session (setsid, a daemon's child) opened a terminal's path given as
    --input without O_NOCTTY: the terminal became its controlling one, and its hangup killed the
    process (SIGHUP) once the terminal closed; a test suite run so died at the terminal test."""
    leader, follower = os.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", TERMINAL_AS_INPUT, os.ttyname(follower), str(tmp_path / "a.json")],
                              capture_output=True, text=True, timeout=50, start_new_session=True)
    finally:
        os.close(leader)
        os.close(follower)
    assert done.returncode == 0, done.stderr
    said, tty_nr = done.stdout.splitlines()
    assert said.endswith("the input is a terminal; pipe the questions in (cat questions.jsonl | ggbatch run "
                         "--input - ...)") and tty_nr == "0"
