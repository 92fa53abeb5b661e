"""The memory a job may use where a cgroup limits it (a container's --memory, Slurm's --mem,
systemd's MemoryMax), read from real cgroup files written under a folder in each layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggbatch.runner.errors import ConfigError
from ggbatch.runner.plan.cgroup_memory import Memory, Room, cgroup_room, memory_of, system_memory
from ggbatch.runner.plan.layout import PromptFacts, settle, start
from ggbatch.runner.watch.monitor import Monitor
from ggbatch.runner.watch.watch import RunWatch

GIB = 1 << 30


def _group(folder: Path, **files: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(f"{text}\n")
    return folder


def test_v2_takes_the_tightest_limit_of_the_group_and_its_ancestors(tmp_path):
    job = _group(tmp_path / "system.slice" / "job_7", memory_max=24 * GIB, memory_current=10 * GIB)
    _group(job / "step_0", memory_max="max", memory_current=9 * GIB)
    _group(tmp_path / "system.slice", memory_max="max", memory_current=40 * GIB)
    (job / "memory.stat").write_text(f"anon {8 * GIB}\nfile {2 * GIB}\ninactive_file {GIB}\nactive_file {GIB}\n")
    membership = "0::/system.slice/job_7/step_0\n"
    # the page cache the kernel drops first (inactive_file) is room, as the host's available memory counts it
    assert cgroup_room(tmp_path, membership) == Room(24 * GIB, 15 * GIB)
    (job / "memory.max").write_text("max\n")
    assert cgroup_room(tmp_path, membership) is None


def test_v2_in_a_container_reads_the_mount_root_when_the_host_path_is_not_there(tmp_path):
    _group(tmp_path, memory_max=2 * GIB, memory_current=GIB // 2)
    assert cgroup_room(tmp_path, "0::/docker/0123abcd\n") == Room(2 * GIB, GIB + GIB // 2)


def test_v1_reads_the_memory_controller_and_its_no_limit_value(tmp_path):
    membership = "12:pids:/user\n4:memory:/slurm/uid_0/job_9\n3:cpu,cpuacct:/slurm\n1:name=systemd:/x\n"
    job = _group(tmp_path / "memory" / "slurm" / "uid_0" / "job_9", memory_limit_in_bytes=3 * GIB,
                 memory_usage_in_bytes=GIB)
    _group(tmp_path / "memory" / "slurm", memory_limit_in_bytes=9223372036854771712, memory_usage_in_bytes=5 * GIB)
    (job / "memory.stat").write_text(f"cache {GIB}\ntotal_inactive_file {GIB // 4}\n")
    assert cgroup_room(tmp_path, membership) == Room(3 * GIB, 2 * GIB + GIB // 4)
    (job / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_room(tmp_path, membership) is None


def test_no_cgroup_files_or_a_usage_past_the_limit(tmp_path):
    assert cgroup_room(tmp_path, "0::/\n") is None
    assert cgroup_room(tmp_path / "absent", "4:memory:/a\n0::/a\n") is None
    _group(tmp_path / "a", memory_max=GIB, memory_current=2 * GIB)
    assert cgroup_room(tmp_path, "0::/a\n") == Room(GIB, 0)


def test_the_memory_used_is_the_smaller_of_the_host_and_the_cgroup():
    assert memory_of(60 * GIB, 64 * GIB, None) == Memory(60 * GIB, 64 * GIB)
    # by_cgroup: the cgroup's room, not the host's, is what the job has (a refusal names the limit)
    assert memory_of(60 * GIB, 64 * GIB, Room(24 * GIB, 4 * GIB)) == Memory(4 * GIB, 24 * GIB, 24 * GIB, True)
    assert memory_of(GIB, 64 * GIB, Room(24 * GIB, 4 * GIB)) == Memory(GIB, 24 * GIB, 24 * GIB, False)


def test_a_model_a_cgroup_has_no_room_for_is_refused_naming_the_cgroups_limit():
    """In a container given --memory, the host's `free` shows room the job does not have: the
    refusal said only "N MiB available"."""
    from test_gpu import DIMS

    started = start([0], workers=1, threads=1, n_records=10, flags=frozenset())
    facts = PromptFacts(10, 100, 0, 0, DIMS)
    with pytest.raises(ConfigError, match=r"not enough memory for one worker with one slot: .* 100 MiB available; "
                                          r"this process's cgroup limits it to 512 MiB \(a container's --memory"):
        settle(started, facts, max_tokens=64, available=100 * 2**20, cgroup_limit=512 * 2**20)
    with pytest.raises(ConfigError) as host_only:
        settle(started, facts, max_tokens=64, available=100 * 2**20)
    assert str(host_only.value).endswith("100 MiB available")


@pytest.mark.timeout(60)
def test_the_pause_and_the_monitor_use_this_machines_memory_as_the_cgroup_module_reads_it():
    memory = system_memory()
    with RunWatch("off") as watch:
        assert watch.memory_pause.low == int(memory.total * 0.05)
    monitor = Monitor()
    assert monitor.sample({}) <= system_memory().available + GIB  # what else runs may free some meanwhile
    assert monitor.summary().cgroup_limit_mib == (None if memory.limit is None else round(memory.limit / 2**20, 1))
