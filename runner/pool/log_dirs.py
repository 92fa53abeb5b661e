"""The folder of a run's worker logs (a file a worker, whose last line is quoted when it dies),
named for the coordinator's pid: a run removes its own when it ends, and the folders of runs
killed before they could (kill -9, the kernel's out-of-memory killer) are removed by the next run
on the machine, once their pid is no longer alive.

    /tmp/ggbatch-workers-<pid>-<random>/worker-0.log
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

import psutil

PREFIX = "ggbatch-workers-"


def make_log_dir() -> str:
    """A new folder for this run's worker logs; the orphans of dead runs go first."""
    remove_orphans()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def owner_pid(name: str) -> Optional[int]:
    """The pid a log folder's name carries, or None: not a log folder, or one named before the pid was."""
    if not name.startswith(PREFIX):
        return None
    pid, dash, _ = name[len(PREFIX):].partition("-")
    return int(pid) if dash and pid.isdigit() else None


def remove_orphans(root: Optional[str] = None) -> int:
    """Removes the log folders under `root` (the temporary folder) whose run is dead: how many.
    A folder of another user is left where it is (no permission); so is one whose pid a new
    process has taken, until that process ends."""
    removed = 0
    try:
        entries = list(os.scandir(root or tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        pid = owner_pid(entry.name)
        if pid is None or pid == os.getpid() or psutil.pid_exists(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += not os.path.exists(entry.path)
    return removed
