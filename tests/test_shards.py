"""Shards, the pure layer: the split by a hash of the id (stable, balanced, every id in exactly
one shard), the shard spec and Slurm's array variables, the shard's file names, the job setting
and the journal that refuses another shard's output."""

import hashlib
import re
import subprocess
import sys
from array import array
from collections import Counter

import pytest

from ggbatch.runner.config.schema import build_config
from ggbatch.runner.errors import ConfigError, OutputError
from ggbatch.runner.files.formats.record import Record
from ggbatch.runner.files.shards import Shard, in_shard, parse_shard, shard_in_name, shard_of, shard_path
from ggbatch.runner.journal.fingerprint import fingerprint
from ggbatch.runner.journal.journal import Journal
from ggbatch.runner.model.identity import ModelIdentity
from ggbatch.workers.protocol import GenerationParams, Question
from helpers import answer as make_answer
from helpers import ggbatch_command

GSM8K_IDS = [f"gsm8k-{i}" for i in range(1, 1320)]


def test_the_split_is_a_fixed_function_of_the_id():
    # These values are part of the file format of a sharded job: a rerun, a newer Python or
    # another machine must give every id the same shard. docs/guide/shards.md gives the formula.
    ids = ("gsm8k-1", "gsm8k-2", "gsm8k-3", "q1", "7", "007", "é")
    assert [shard_of(q, 8) for q in ids] == [4, 6, 6, 0, 2, 5, 7]
    formula = [int.from_bytes(hashlib.blake2b(q.encode("utf-8"), digest_size=8).digest(), "big") % 8 for q in ids]
    assert formula == [shard_of(q, 8) for q in ids]
    assert shard_of("anything", 1) == 0


@pytest.mark.timeout(60)
def test_the_split_is_the_same_in_other_processes_whatever_their_hash_seed():
    code = ("from ggbatch.runner.files.shards import shard_of; "
            f"print([shard_of(q, 5) for q in {GSM8K_IDS[:200]!r}])")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert seen == {f"{[shard_of(q, 5) for q in GSM8K_IDS[:200]]}\n"}


@pytest.mark.parametrize("count", [2, 3, 8, 16])
def test_every_id_is_in_exactly_one_shard_in_file_order(count):
    records = [Record(q, {}, i) for i, q in enumerate(GSM8K_IDS, start=1)]
    shards = [[r for r in records if in_shard(r.qid, Shard(i, count))] for i in range(count)]
    assert sorted(r.qid for s in shards for r in s) == sorted(GSM8K_IDS)  # all, none twice
    assert all([r.line for r in s] == sorted(r.line for r in s) for s in shards)
    assert all(s for s in shards)
    assert [r for r in records if in_shard(r.qid, None)] == records


def test_the_split_is_balanced_for_many_ids():
    counts = Counter(shard_of(f"q{i}", 8) for i in range(80_000))
    assert sorted(counts) == list(range(8))
    assert all(abs(n - 10_000) < 400 for n in counts.values()), counts  # 4 standard deviations
    gsm8k = Counter(shard_of(q, 3) for q in GSM8K_IDS)
    assert all(abs(n - 1319 / 3) < 70 for n in gsm8k.values()), gsm8k


@pytest.mark.parametrize("spec,shard", [("0/3", Shard(0, 3)), ("2/3", Shard(2, 3)), (" 1 / 2 ", Shard(1, 2)),
                                        ("0/1", Shard(0, 1))])
def test_a_shard_spec(spec, shard):
    assert parse_shard(spec, {}) == shard and str(shard) == spec.replace(" ", "")


@pytest.mark.parametrize("spec", ["3/3", "x/2", "1/0", "-1/3", "1/3/4", "", "1", "1.0/3", "auto/3"])
def test_a_bad_shard_spec_says_what_a_good_one_is(spec):
    with pytest.raises(ValueError, match=r"^must be I/N with 0 <= I < N \(shards count from 0: 0/3, 1/3, 2/3\), "
                                         r"or auto$"):
        parse_shard(spec, {})


def slurm(task, count, low=None, high=None, step=None):
    env = {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": str(count)}
    for name, value in (("MIN", low), ("MAX", high), ("STEP", step)):
        if value is not None:
            env[f"SLURM_ARRAY_TASK_{name}"] = str(value)
    return env


@pytest.mark.parametrize("array,tasks,low,high,step", [
    ("--array=0-3", [0, 1, 2, 3], 0, 3, None),
    ("--array=1-4", [1, 2, 3, 4], 1, 4, None),  # 1-based: SLURM_ARRAY_TASK_MIN is subtracted
    ("--array=10-16:2", [10, 12, 14, 16], 10, 16, 2),
    ("no MIN/MAX (older Slurm)", [0, 1, 2, 3], None, None, None),
])
def test_auto_reads_the_slurm_array(array, tasks, low, high, step):
    shards = [parse_shard("auto", slurm(t, 4, low, high, step)) for t in tasks]
    assert shards == [Shard(i, 4) for i in range(4)], array
    assert "SLURM_ARRAY_TASK_ID" in shards[1].source


def test_auto_outside_a_slurm_array_names_the_variables():
    with pytest.raises(ValueError, match="^auto reads SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT, which are "
                                         r"not set here \(not a task of a Slurm job array\); give the shard as I/N$"):
        parse_shard("auto", {"SLURM_JOB_ID": "7"})


@pytest.mark.parametrize("env,says", [
    (slurm(5, 1, 5, 5), "one-task array"),  # sbatch --array=5: a rerun of task 5, not the whole job
    (slurm(5, 2, 3, 5), "one evenly spaced range"),  # sbatch --array=3,5
    (slurm(9, 4, 0, 3), "one evenly spaced range"),
    ({**slurm(1, 4), "SLURM_ARRAY_TASK_MIN": "one"}, "SLURM_ARRAY_TASK_MIN must be a whole number"),
])
def test_auto_refuses_an_array_it_cannot_map(env, says):
    with pytest.raises(ValueError, match=says):
        parse_shard("auto", env)


@pytest.mark.parametrize("path,expected", [
    ("answers.jsonl", "answers.shard-2-of-8.jsonl"), ("out/a.b.csv", "out/a.b.shard-2-of-8.csv"),
    ("/x/answers", "/x/answers.shard-2-of-8"), ("answers.shard-2-of-8.jsonl", "answers.shard-2-of-8.jsonl"),
    ("answers.shard-2-of-8", "answers.shard-2-of-8"), ("a.shard-1-of-8.json", "a.shard-1-of-8.shard-2-of-8.json"),
])
def test_a_shard_writes_files_of_its_own(path, expected):
    assert shard_path(path, Shard(2, 8)) == expected
    assert shard_in_name(expected) == Shard(2, 8)


def test_shard_in_name():
    assert shard_in_name("answers.jsonl") is None and shard_in_name("a.shard-3-of-3.json") is None
    assert shard_in_name("/runs/a.shard-0-of-3.json") == Shard(0, 3)


def config(**layer):
    return build_config([("command line", {"model": "m.gguf", "input": "q.jsonl", "output": "a.json", **layer})])


def test_the_shard_setting_names_the_outputs_after_the_shard(monkeypatch):
    c = config(shard="1/3", report="r.json", errors_output="e.json")
    assert (c.shard, c.output, c.report, c.errors_output) == (
        Shard(1, 3), "a.shard-1-of-3.json", "r.shard-1-of-3.json", "e.shard-1-of-3.json")
    assert config().shard is None and config().output == "a.json"
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    assert config(shard="auto").output == "a.shard-2-of-4.json"


def test_a_bad_shard_setting_is_one_line_naming_the_key(monkeypatch):
    with pytest.raises(ConfigError, match=r"^command line: shard: must be I/N .*, got '3/3'$"):
        config(shard="3/3")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    with pytest.raises(ConfigError, match=r"^command line: shard: auto reads SLURM_ARRAY_TASK_ID and "
                                          r"SLURM_ARRAY_TASK_COUNT, .*, got 'auto'$"):
        config(shard="auto")


@pytest.mark.parametrize("key,stream", [("output", "-"), ("output", "/dev/stdout"), ("report", "-"),
                                        ("errors_output", "/dev/fd/1"), ("output", "/dev/null")])
def test_a_shard_refuses_standard_output_and_devices_as_a_run_without_one_does(key, stream):
    """`-` renamed after the shard was `-.shard-0-of-1`, a plain file's name that passed."""
    with pytest.raises(OutputError, match=rf"^{stream}: ggbatch writes .* not to standard output, a pipe or a device"):
        config(shard="0/1", **{key: stream})


@pytest.mark.parametrize("key,role", [("output", "the answers file (output)"), ("report", "the report"),
                                      ("errors_output", "the errors file (errors_output)")])
def test_a_shard_refuses_a_folders_name_as_a_run_without_one_does(key, role):
    """`out/` renamed after the shard was `out.shard-0-of-2`, written beside the folder, exit 0."""
    with pytest.raises(OutputError, match=rf"^out/: {re.escape(role)} is a folder's name \(it ends in /\)"):
        config(shard="0/2", **{key: "out/"})


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags", [["--output", "-"], ["--output", "/dev/stdout"], ["--report", "-"]])
def test_the_cli_with_a_shard_refuses_standard_output_and_writes_nothing(tmp_path, stories, flags):
    """Refused before any work: the run used to answer into `./-.shard-1-of-2` (or /dev/stdout.shard-1-of-2)."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n{"questionID": "b", "question": "Ho"}\n')
    command = ggbatch_command("run", "--model", stories, "--input", "q.jsonl", "--output", "a.jsonl", *flags,
                              "--shard", "1/2", "--max-tokens", 2, "--workers", 1, "-q")
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 2 and "not to standard output, a pipe or a device" in done.stderr, done.stderr
    assert done.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"]


def test_a_shards_journal_refuses_another_shard(tmp_path):
    model = ModelIdentity("m.gguf", 1, 0.0, "abc")
    prints = {s: fingerprint(config(shard=s), model, GenerationParams(), "t") for s in ("0/3", "1/3")}
    assert prints["0/3"]["shard"] == "0/3" and fingerprint(config(), model, GenerationParams(), "t")["shard"] is None
    path = str(tmp_path / "a.shard-0-of-3.json.journal.jsonl")
    j = Journal(path, prints["0/3"])
    j.split([Question("q1", array("i", [1]), 0)])
    j.append([make_answer("q1", "x", tokens=1)])  # a journal of no answer would be replaced
    j.close()
    with pytest.raises(ConfigError, match=r"'shard' changed since the journaled run \('0/3' -> '1/3'\)"):
        Journal(path, prints["1/3"])
