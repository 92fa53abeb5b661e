"""Worker log folders named for their run's pid: a run killed before it could remove its own has
it removed by the next run, and nothing of a live run or of an unknown name is touched."""

from __future__ import annotations

import os
import subprocess
import sys

from ggbatch.runner.pool.log_dirs import make_log_dir, owner_pid, remove_orphans


def test_the_pid_is_read_from_the_name_only_where_a_log_folder_carries_one():
    assert owner_pid("ggbatch-workers-4242-abc123") == 4242
    assert owner_pid("ggbatch-workers-k2j3abcd") is None  # named before the pid was
    assert owner_pid("ggbatch-workers-12") is None and owner_pid("pytest-of-root") is None


def test_the_folders_of_dead_runs_go_and_the_others_stay(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    orphan = tmp_path / f"ggbatch-workers-{dead.pid}-x1"
    live = tmp_path / f"ggbatch-workers-{os.getppid()}-x2"
    unknown = tmp_path / "ggbatch-workers-k2j3abcd"
    for folder in (orphan, live, unknown):
        folder.mkdir()
        (folder / "worker-0.log").write_text("last words\n")
    assert remove_orphans(str(tmp_path)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, unknown.name])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    mine = make_log_dir()
    assert os.path.dirname(mine) == str(tmp_path)
    assert os.path.basename(mine).startswith(f"ggbatch-workers-{os.getpid()}-")
