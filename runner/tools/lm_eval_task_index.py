"""lm-eval's index of its own tasks kept between runs, for `ggbatch eval`.

Every lm-eval run starts by reading each task YAML it ships to learn the tasks' names (its
TaskManager: 13,986 files in lm-eval 0.4.13), whatever tasks are asked for: 5.6 s on this
project's 2-core machine, more than the rest of a small evaluation on a GPU. Those files change
only with lm-eval itself, so the index of them is kept in ggbatch's cache folder, under a
fingerprint of every file's path, size and modification time (a walk of lm-eval's task folder:
0.16 s), and read from there while the fingerprint is the same. Task folders of the user's own
(--include_path) are read each run, as lm-eval reads them. There is one index per lm-eval version;
writing one removes those of other versions unused for 30 days.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..files.paths import ggbatch_cache

log = logging.getLogger("ggbatch")

INDEX_FILE = "lm-eval-{version}-task-index.pickle"  # in ggbatch's cache folder, one per lm-eval version
# Another version's index (about 16 MB) unused this long is removed when one is written: it is an
# upgrade's leftover, where one used lately may be another environment's lm-eval.
UNUSED_S = 30 * 24 * 3600


def cache_task_index() -> bool:
    """lm-eval's TaskIndex.build made to take the index of lm-eval's own tasks from ggbatch's
    cache folder, built and kept there once. False, and lm-eval left as it is, where its task
    index is not the one this knows (another lm-eval version)."""
    try:
        import lm_eval
        import lm_eval.tasks as tasks
        from lm_eval.tasks._index import TaskIndex
    except ImportError:
        return False
    build = TaskIndex.__dict__.get("build")
    if not isinstance(build, staticmethod):
        return False
    if getattr(build.__func__, "builds", None) is not None:
        return True
    shipped = Path(tasks.__file__).parent
    cache = ggbatch_cache() / INDEX_FILE.format(version=lm_eval.__version__)
    TaskIndex.build = staticmethod(_with_cached(build.__func__, shipped, cache))
    return True


def _with_cached(build: Callable[..., dict[str, Any]], shipped: Path, cache: Path) -> Callable[..., dict[str, Any]]:
    """TaskIndex.build, the index of `shipped` read from `cache` while its files are the same."""

    def cached_build(paths: Iterable[Path], *, resolve_includes: bool = True) -> dict[str, Any]:
        paths = list(paths)
        if not paths or Path(paths[0]) != shipped or not resolve_includes:
            return build(paths, resolve_includes=resolve_includes)
        index = _shipped_index(build, shipped, cache)
        for name, entry in (build(paths[1:]) if paths[1:] else {}).items():
            if name in index:  # as lm-eval merges its folders: the later wins, and says so
                logging.getLogger("lm_eval.tasks._index").warning(
                    "Task '%s' from %s overrides existing task from %s", name, entry.yaml_path, index[name].yaml_path)
            index[name] = entry
        return index

    cached_build.builds = build  # type: ignore[attr-defined]  # the function it wraps
    return cached_build


def _shipped_index(build: Callable[..., dict[str, Any]], shipped: Path, cache: Path) -> dict[str, Any]:
    """The index of lm-eval's own tasks: the one kept, while its files' fingerprint is the same;
    else built, and kept for the next run."""
    fingerprint = files_fingerprint(shipped)
    kept = _read(cache)
    if kept is not None and kept.get("fingerprint") == fingerprint:
        _used(cache)
        return dict(kept["index"])
    index = build([shipped])
    if _write(cache, {"fingerprint": fingerprint, "index": index}):
        _remove_unused(cache)
    return dict(index)


def _used(cache: Path) -> None:
    """Its modification time is its last use (another version's writing removes those long unused)."""
    try:
        os.utime(cache)
    except OSError:
        pass


def _remove_unused(cache: Path, unused_s: float = UNUSED_S) -> None:
    """Other lm-eval versions' indexes in the folder of `cache` unused for `unused_s` seconds."""
    oldest = time.time() - unused_s
    for other in cache.parent.glob(INDEX_FILE.format(version="*")):
        try:
            if other != cache and other.stat().st_mtime < oldest:
                other.unlink()
        except OSError:  # gone already, or not ours to remove
            pass


def files_fingerprint(folder: Path) -> str:
    """A digest of the path, size and modification time of every task YAML under `folder`."""
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(f for f in files if f.endswith(".yaml")):
            st = os.stat(os.path.join(root, name))
            digest.update(f"{os.path.relpath(root, folder)}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _read(cache: Path) -> Optional[dict[str, Any]]:
    """What was kept, or None (none yet, or a file that cannot be read back: built again)."""
    collecting = gc.isenabled()
    try:
        with open(cache, "rb") as f:
            # Its 14,000 entries' many small objects make the collector run again and again:
            # without it, 0.23 s instead of 0.4-1.4 s.
            gc.disable()
            kept = pickle.load(f)
        return kept if isinstance(kept, dict) else None
    except Exception as exc:  # missing, cut short, from another Python: build it again
        if not isinstance(exc, FileNotFoundError):
            log.debug("lm-eval's task index at %s not read back (%s): built again", cache, exc)
        return None
    finally:
        if collecting:
            gc.enable()


def _write(cache: Path, kept: dict[str, Any]) -> bool:
    """Kept whole or not at all (written aside, then renamed); a folder that cannot be written
    only means the index is built again next run. Whether it was kept."""
    aside: Optional[str] = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache.parent, prefix=cache.name, delete=False) as f:
            aside = f.name
            pickle.dump(kept, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(aside, cache)
        return True
    except OSError as exc:
        log.debug("lm-eval's task index not kept in %s (%s)", cache.parent, exc)
        if aside is not None and os.path.exists(aside):
            os.unlink(aside)
        return False
