"""The memory the job may use: the host's available memory, or less where a cgroup limits the
process (a container's `--memory`, a Slurm job's `--mem`, systemd's MemoryMax). The memory plan
(runner/launch.py settle) and the low-memory pause (runner/watch/memory_guard.py) use the smaller,
as the kernel's out-of-memory killer acts on the cgroup's limit long before the host runs short.

cgroup v2: `memory.max` less `memory.current`; v1: `memory.limit_in_bytes` less
`memory.usage_in_bytes`. "max", a file that is absent, or v1's "no limit" (the largest
page-aligned long) is no limit. The group's usage counts the page cache its processes filled
(the journal and answers written, the questions read): the inactive part of it (memory.stat's
inactive_file) is what the kernel drops first when the group nears its limit, so it is room, as
the host's available memory counts it. The group's ancestors limit it too: the tightest wins. A
container with a cgroup namespace of its own sees its group as the mount's root, where the
path /proc/self/cgroup names does not exist: the folders that do, up to the root, are read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil

MOUNT = Path("/sys/fs/cgroup")
MEMBERSHIP = Path("/proc/self/cgroup")
V1_UNLIMITED = 1 << 62  # v1 says "no limit" as 9223372036854771712
# (limit, usage, memory.stat's reclaimable page cache) of each version
FILES = {2: ("memory.max", "memory.current", "inactive_file"),
         1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}


@dataclass(frozen=True)
class Room:
    """A cgroup's memory limit and what of it is not held now, in bytes."""

    limit: int
    free: int


@dataclass(frozen=True)
class Memory:
    """The memory the job may use, in bytes: the smaller of the host's and its cgroup's."""

    available: int
    total: int
    limit: Optional[int] = None  # the cgroup's limit, when one holds the process
    by_cgroup: bool = False  # available is the cgroup's room, less than the host's


def cgroup_room(mount: Path, membership: str) -> Optional[Room]:
    """The tightest memory limit on the groups that /proc/self/cgroup's text (membership) names,
    under the cgroup mount (/sys/fs/cgroup); None: no limit."""
    rooms = [room for folder, version in _group_folders(mount, membership)
             if (room := _room(folder, version)) is not None]
    return min(rooms, key=lambda r: r.free, default=None)


def memory_of(host_available: int, host_total: int, room: Optional[Room]) -> Memory:
    if room is None:
        return Memory(host_available, host_total)
    return Memory(min(host_available, room.free), min(host_total, room.limit), room.limit, room.free < host_available)


def system_memory() -> Memory:
    """The memory this process may use now."""
    vm = psutil.virtual_memory()
    try:
        membership = MEMBERSHIP.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):  # not Linux, or no cgroups: the host's
        return memory_of(vm.available, vm.total, None)
    return memory_of(vm.available, vm.total, cgroup_room(MOUNT, membership))


def _group_folders(mount: Path, membership: str) -> list[tuple[Path, int]]:
    """Each group's folder and those above it, with its cgroup version: `0::PATH` is v2's,
    `N:...memory...:PATH` v1's memory controller (in a folder of its own under the mount)."""
    folders = []
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if parts[0] == "0" and not controllers:
            folders += [(f, 2) for f in _up_from(mount, path)]
        elif "memory" in controllers.split(","):
            folders += [(f, 1) for f in _up_from(mount / "memory", path)]
    return folders


def _up_from(mount: Path, path: str) -> list[Path]:
    names = [n for n in path.split("/") if n and n not in (".", "..")]
    return [f for f in (mount.joinpath(*names[:i]) for i in range(len(names), -1, -1)) if f.is_dir()]


def _room(folder: Path, version: int) -> Optional[Room]:
    limit_file, usage_file, inactive_key = FILES[version]
    limit = _number(folder / limit_file)
    if limit is None or limit >= V1_UNLIMITED:
        return None
    held = max(0, (_number(folder / usage_file) or 0) - _stat(folder / "memory.stat", inactive_key))
    return Room(limit, max(0, limit - held))


def _number(path: Path) -> Optional[int]:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat(path: Path, key: str) -> int:
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0
