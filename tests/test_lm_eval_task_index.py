"""`ggbatch eval` keeps lm-eval's index of its own tasks between runs (runner/tools/lm_eval_task_index.py):
the tasks found must be lm-eval's own, read again when a task file changes, and the user's task
folders read every run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def task_index():
    """lm-eval's TaskIndex, its build put back after the test."""
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from lm_eval.tasks._index import TaskIndex

    build = TaskIndex.__dict__["build"]
    yield TaskIndex
    TaskIndex.build = build


def write_task(folder: Path, file: str, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file
    path.write_text(f"task: {name}\ndataset_path: json\noutput_type: generate_until\ndoc_to_text: q\n"
                    "doc_to_target: a\n", encoding="utf-8")
    return path


def test_an_index_kept_is_read_back_until_one_of_its_files_changes(task_index, tmp_path):
    from ggbatch.runner.tools.lm_eval_task_index import _with_cached

    shipped, built = tmp_path / "shipped", []
    first = write_task(shipped, "a.yaml", "task_a")
    write_task(shipped / "sub", "b.yaml", "task_b")

    def build(paths, *, resolve_includes=True):
        built.append([Path(p).name for p in paths])
        return task_index.build(paths, resolve_includes=resolve_includes)

    cached = _with_cached(build, shipped, tmp_path / "cache" / "index.pickle")
    assert sorted(cached([shipped])) == sorted(cached([shipped])) == ["task_a", "task_b"]
    assert built == [["shipped"]]  # the second run read what the first kept
    write_task(shipped, "a.yaml", "task_a2")
    os.utime(first, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns + 10**9))
    assert sorted(cached([shipped])) == ["task_a2", "task_b"]
    assert built == [["shipped"], ["shipped"]]
    # The user's own folder, after lm-eval's: read each run, a name of its own winning
    mine = tmp_path / "mine"
    write_task(mine, "x.yaml", "task_b")
    got = cached([shipped, mine])
    assert got["task_b"].yaml_path == mine / "x.yaml" and "task_a2" in got
    assert built[-1] == ["mine"]


def test_a_cache_folder_that_cannot_be_written_only_builds_again(task_index, tmp_path):
    from ggbatch.runner.tools.lm_eval_task_index import _with_cached

    shipped, blocker = tmp_path / "shipped", tmp_path / "file"
    write_task(shipped, "a.yaml", "task_a")
    blocker.write_text("a file where the cache folder would be")
    cached = _with_cached(task_index.build, shipped, blocker / "index.pickle")
    assert list(cached([shipped])) == list(cached([shipped])) == ["task_a"]


def test_lm_evals_task_manager_finds_the_same_tasks_from_the_index_kept(task_index, tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    from ggbatch.runner.tools.lm_eval_task_index import cache_task_index

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mine = tmp_path / "mine"
    local = write_task(mine, "x.yaml", "ggb_local_task")
    stock = TaskManager(include_path=str(mine)).all_tasks
    assert cache_task_index() and cache_task_index()
    assert TaskManager(include_path=str(mine)).all_tasks == stock  # built, and kept
    assert list((tmp_path / "cache" / "ggbatch").glob("lm-eval-*-task-index.pickle"))
    write_task(mine, local.name, "ggb_local_task_renamed")
    again = TaskManager(include_path=str(mine)).all_tasks  # read back
    assert "ggb_local_task_renamed" in again and "ggb_local_task" not in again
    assert set(again) - {"ggb_local_task_renamed"} == set(stock) - {"ggb_local_task"}


def test_writing_an_index_removes_other_versions_long_unused_and_reading_one_marks_it_used(task_index, tmp_path):
    from ggbatch.runner.tools.lm_eval_task_index import UNUSED_S, _with_cached

    shipped, cache = tmp_path / "shipped", tmp_path / "cache"
    write_task(shipped, "a.yaml", "task_a")
    cache.mkdir()
    long_ago = 1_000_000_000  # 2001: far longer ago than UNUSED_S
    assert long_ago < os.path.getmtime(tmp_path) - UNUSED_S
    leftovers = {name: cache / name for name in ("lm-eval-0.4.1-task-index.pickle",  # an upgrade's
                                                 "lm-eval-0.4.2-task-index.pickle",  # used lately
                                                 "notes.txt")}  # not an index
    for path in leftovers.values():
        path.write_text("kept")
    for name in ("lm-eval-0.4.1-task-index.pickle", "notes.txt"):
        os.utime(leftovers[name], (long_ago, long_ago))
    mine = cache / "lm-eval-9.9-task-index.pickle"
    cached = _with_cached(task_index.build, shipped, mine)
    assert list(cached([shipped])) == ["task_a"]
    assert sorted(p.name for p in cache.iterdir()) == ["lm-eval-0.4.2-task-index.pickle", mine.name, "notes.txt"]

    os.utime(mine, (long_ago, long_ago))
    assert list(cached([shipped])) == ["task_a"]  # read back: used now
    assert os.path.getmtime(mine) > long_ago
