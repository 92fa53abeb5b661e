"""Shards for job arrays: `--shard I/N` answers the questions whose id hashes to I of N.

    question file ─▶ records ─▶ in_shard (I/N) ─▶ the rest of run_job, unchanged
                                                         answers.shard-I-of-N.jsonl (+ its journal)
    ggbatch merge ─▶ answers.jsonl, in the question file's order (runner/merge/join.py)

The split is a hash of the id's UTF-8 bytes (blake2b, 8 bytes, big-endian, modulo N): the same on
every machine, Python version and process (Python's hash() of a str is salted per process), and
it depends on the id alone, so a rerun of one shard gets the same questions, and a question file
that grew keeps every old question in its shard (its journal still holds the answers).

A sharded job writes its answers, report and errors file under names that say the shard
(`answers.jsonl` -> `answers.shard-2-of-8.jsonl`): every task of an array can run the same job
file, and the journal of each is its own output's. `--shard auto` takes the shard from a Slurm
job array (SLURM_ARRAY_TASK_ID, _COUNT, _MIN, _STEP).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

SLURM_ID, SLURM_COUNT = "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"
SLURM_MIN, SLURM_MAX, SLURM_STEP = "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP"
SPEC = re.compile(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*")
NAME_TAG = re.compile(r"\.shard-(\d+)-of-(\d+)(?=\.|$)")
SPEC_HELP = "must be I/N with 0 <= I < N (shards count from 0: 0/3, 1/3, 2/3), or auto"


@dataclass(frozen=True)
class Shard:
    index: int  # from 0
    count: int
    source: str = field(default="", compare=False)  # where auto found it, for the log

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def tag(self) -> str:
        """What its files' names carry: `.shard-2-of-8`."""
        return f".shard-{self.index}-of-{self.count}"


def shard_of(qid: str, count: int) -> int:
    """The shard (0 .. count-1) of a question id: stable across machines, versions and processes."""
    digest = hashlib.blake2b(qid.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def in_shard(qid: str, shard: Optional[Shard]) -> bool:
    """Whether a question belongs to this shard (every question does without a shard)."""
    return shard is None or shard_of(qid, shard.count) == shard.index


def parse_shard(spec: str, env: Mapping[str, str]) -> Shard:
    """`I/N`, or `auto`: from a Slurm job array's variables in `env`. ValueError says what is wrong."""
    if not isinstance(spec, str):
        raise ValueError(SPEC_HELP)
    if spec.strip() == "auto":
        return slurm_shard(env)
    match = SPEC.fullmatch(spec)
    if not match or not int(match[1]) < int(match[2]):
        raise ValueError(SPEC_HELP)
    return Shard(int(match[1]), int(match[2]))


def slurm_shard(env: Mapping[str, str]) -> Shard:
    """This task's shard: (SLURM_ARRAY_TASK_ID - _MIN) / _STEP of SLURM_ARRAY_TASK_COUNT, so that
    `--array=0-7`, `--array=1-8` and `--array=0-14:2` each give shards 0/8 .. 7/8."""
    if SLURM_ID not in env or SLURM_COUNT not in env:
        raise ValueError(f"auto reads {SLURM_ID} and {SLURM_COUNT}, which are not set here (not a task of "
                         "a Slurm job array); give the shard as I/N")
    task, count = _env_int(env, SLURM_ID), _env_int(env, SLURM_COUNT)
    low, step = _env_int(env, SLURM_MIN, 0), _env_int(env, SLURM_STEP, 1) or 1
    high = _env_int(env, SLURM_MAX, low + (count - 1) * step)
    said = ", ".join(f"{name}={env[name]}" for name in (SLURM_ID, SLURM_COUNT, SLURM_MIN, SLURM_MAX, SLURM_STEP)
                     if name in env)
    if count == 1:
        # `sbatch --array=5` (rerunning one task) says count 1: shard 0/1 would be the whole job
        raise ValueError(f"auto in a one-task array ({said}) would answer every question; to rerun one "
                         "task of an array give its shard as I/N")
    if high - low != (count - 1) * step or (task - low) % step or not low <= task <= high:
        raise ValueError(f"auto needs the array to be one evenly spaced range, as --array=0-7 ({said}); "
                         "for a list of tasks (a rerun of some) give the shard as I/N")
    return Shard((task - low) // step, count, f"{SLURM_ID} {task} of the array {low}-{high}"
                 + (f":{step}" if step != 1 else ""))


def _env_int(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    value = env.get(name, "").strip()
    if not value and default is not None:
        return default
    if not value.isdigit():
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(value)


def shard_path(path: str, shard: Shard) -> str:
    """The file a shard writes for `path`: `answers.jsonl` -> `answers.shard-2-of-8.jsonl` (the
    extension kept, so the format is the same); a name that already says this shard is kept."""
    p = Path(path)
    if p.stem.endswith(shard.tag) or p.name.endswith(shard.tag):
        return path
    return str(p.with_name(p.stem + shard.tag + p.suffix))


def shard_in_name(path: str) -> Optional[Shard]:
    """The shard a file's name says it holds (`answers.shard-2-of-8.jsonl`), if it says one."""
    found = NAME_TAG.findall(Path(path).name)
    if not found:
        return None
    index, count = map(int, found[-1])
    return Shard(index, count) if index < count else None
