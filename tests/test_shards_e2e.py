"""Shards end to end through the command line, on the demo model in real worker processes: the
shards of a job merged are one unsharded run byte for byte (--batch-invariant: an answer cannot
depend on what it was batched with), `--shard auto` in a Slurm array, a merge with a shard
missing, a shard rerun after a crash, and OpenAI Batch files."""

import json
import os

import pytest

from ggbatch.runner.files.shards import shard_of
from helpers import JOURNAL_HEAD
from helpers import ggbatch as cli

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]

# One thread: on a busy 2-core machine a 2-thread worker waits at llama.cpp's barriers for
# whichever of its threads another process descheduled (docs/guide/layout.md), 10x slower here.
FLAGS = ("--max-tokens", 12, "--batch-invariant", "--workers", 1, "--threads", 1, "--progress", "off")
N = 24


def ggbatch(*args, env=None):
    return cli(*args, env=env)


def slurm(task, count, low):
    """The environment of task `task` of `sbatch --array=low-(low+count-1)`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": str(count),
            "SLURM_ARRAY_TASK_MIN": str(low), "SLURM_ARRAY_TASK_MAX": str(low + count - 1)}


def run_shards(tmp_path, model, questions, output, auto=False):
    """The three shards of the job, each as one task of an array would run it; their files."""
    for i in range(3):
        if auto:  # sbatch --array=1-3: 1-based task ids, SLURM_ARRAY_TASK_MIN subtracted
            r = ggbatch("run", "--model", model, "--input", questions, "--output", output, "--shard", "auto", *FLAGS,
                        env=slurm(i + 1, 3, 1))
        else:
            r = ggbatch("run", "--model", model, "--input", questions, "--output", output, "--shard", f"{i}/3", *FLAGS)
        assert r.returncode == 0, r.stderr
    stem, ext = os.path.splitext(output)
    return [f"{stem}.shard-{i}-of-3{ext}" for i in range(3)]


@pytest.mark.parametrize("fmt,auto", [("json", False), ("jsonl", True)])
def test_three_shards_merged_are_one_unsharded_run_byte_for_byte(tmp_path, demo_model, questions_file, fmt, auto):
    questions, whole = questions_file(N), tmp_path / f"whole.{fmt}"
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", whole, *FLAGS)
    assert r.returncode == 0, r.stderr
    parts = run_shards(tmp_path, demo_model, questions, str(tmp_path / f"answers.{fmt}"), auto)
    ids = [f"q{i}" for i in range(N)]
    for i, part in enumerate(parts):  # each shard holds its own questions, in input order
        text = open(part, encoding="utf-8").read()
        rows = json.loads(text) if fmt == "json" else [json.loads(line) for line in text.splitlines()]
        assert [row["questionID"] for row in rows] == [q for q in ids if shard_of(q, 3) == i]
    merged = tmp_path / f"merged.{fmt}"
    r = ggbatch("merge", "--input", questions, "--output", merged, *parts)
    assert r.returncode == 0, r.stderr
    assert merged.read_bytes() == whole.read_bytes()

    r = ggbatch("merge", "--input", questions, "--output", merged, parts[0], parts[2])
    missing = [q for q in ids if shard_of(q, 3) == 1]
    named = ", ".join(repr(q) for q in missing[:5])
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "ggbatch: merge: no part is named for shard 1/3",
        f"ggbatch: merge: {len(missing)} of {N} questions are in no part: {named} and {len(missing) - 5} more (by "
        f"their ids, of shard 1/3); {merged} marks them not answered"]


def test_a_shard_rerun_after_a_crash_answers_only_what_its_journal_lacks(tmp_path, demo_model, questions_file):
    questions, output, report = questions_file(N), tmp_path / "answers.json", tmp_path / "report.json"
    args = ("run", "--model", demo_model, "--input", questions, "--output", output, "--report", report,
            "--shard", "0/3", *FLAGS)
    r = ggbatch(*args)
    assert r.returncode == 0, r.stderr
    part, journal = tmp_path / "answers.shard-0-of-3.json", tmp_path / "answers.shard-0-of-3.json.journal.jsonl"
    expected = part.read_bytes()
    # What kill -9 in the middle leaves: the head lines, two answers, a torn line, no answers file.
    lines = journal.read_text(encoding="utf-8").splitlines(keepends=True)
    journal.write_text("".join(lines[:JOURNAL_HEAD + 2]) + lines[JOURNAL_HEAD + 2][:25], encoding="utf-8")
    part.unlink()
    r = ggbatch(*args)
    assert r.returncode == 0, r.stderr
    assert part.read_bytes() == expected
    q = json.loads((tmp_path / "report.shard-0-of-3.json").read_text())["questions"]
    assert q["shard"] == {"index": 0, "count": 3}
    answers = len(lines) - JOURNAL_HEAD
    assert (q["records"], q["from_journal"], q["answered"]) == (answers, 2, answers)
    assert "shard 0/3: " in r.stderr and f" of {N} questions, answers to {part}" in r.stderr


def chat(cid, text):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": text}], "max_tokens": 6}}


def without_times(line):
    """An OpenAI Batch output line less what says when it was answered (ids and created)."""
    obj = json.loads(line)
    del obj["id"], obj["response"]["request_id"], obj["response"]["body"]["id"], obj["response"]["body"]["created"]
    return obj


def test_openai_batch_shards_merge_line_by_line(tmp_path, demo_model):
    batch = tmp_path / "batch.jsonl"
    lines = [chat(f"req-{i}", text) for i, text in enumerate(
        ["Once upon a time", "The dog", "Lily and Tom", "The sun", "A big red ball", "The cat sat"] * 2)]
    batch.write_text("".join(json.dumps(x) + "\n" for x in lines))
    whole = tmp_path / "whole.jsonl"
    r = ggbatch("run", "--model", demo_model, "--input", batch, "--output", whole, *FLAGS)
    assert r.returncode == 0, r.stderr
    parts = run_shards(tmp_path, demo_model, batch, str(tmp_path / "out.jsonl"))
    merged = tmp_path / "merged.jsonl"
    r = ggbatch("merge", "--input", batch, "--output", merged, *parts)
    assert r.returncode == 0, r.stderr
    kept = {json.loads(line)["custom_id"]: line for p in parts for line in open(p, encoding="utf-8")}
    assert merged.read_text(encoding="utf-8") == "".join(kept[x["custom_id"]] for x in lines)  # lines as they were
    assert [without_times(line) for line in merged.read_text().splitlines()] == \
        [without_times(line) for line in whole.read_text().splitlines()]
