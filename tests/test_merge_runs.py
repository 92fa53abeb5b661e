"""`ggbatch merge` and the runs that wrote its parts: the files a run keeps beside a part (its journal,
its lock) given in a glob, a part whose run is still going or stopped before writing its answers,
answers made for another version of a question, and the split the parts' journals say."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from ggbatch.runner.errors import ConfigError, InputError
from ggbatch.runner.files.shards import shard_of
from ggbatch.runner.merge.command import merge_files
from helpers import ggbatch, write_jsonl, write_questions
from test_merge import write_job


def test_a_journal_given_with_another_spelling_of_its_parts_path_is_left_out(tmp_path):
    """`./answers.shard-0-of-3.jsonl` beside `answers.shard-0-of-3.jsonl.journal.jsonl`: one part
    and its journal, not a journal without its part."""
    questions, whole, parts = write_job(tmp_path, "jsonl")
    journal = f"{parts[0]}.journal.jsonl"
    shutil.copy(parts[0], journal)
    dotted = os.path.join(os.path.dirname(parts[0]), ".", os.path.basename(parts[0]))
    outcome = merge_files(str(tmp_path / "m.jsonl"), [dotted, journal, *parts[1:]], questions)
    assert outcome.parts == 3 and outcome.journals == 1 and (tmp_path / "m.jsonl").read_bytes() == whole


def test_the_lock_a_killed_run_left_beside_a_part_is_left_out_of_a_glob(tmp_path):
    """kill -9 of a shard's run leaves its `.lock` (the kernel lets go of the lock, not the file):
    `answers.shard-*` matches it, and it was read as a part (a CSV error about its pid)."""
    questions, whole, parts = write_job(tmp_path, "jsonl")
    lock, fresh = f"{parts[1]}.lock", f"{parts[2]}.journal.jsonl.fresh"
    with open(lock, "w") as f:
        f.write("4897\n")  # the pid of a run that is gone
    shutil.copy(parts[0], fresh)  # what it holds does not matter: it is not read as a part
    outcome = merge_files(str(tmp_path / "m.jsonl"), sorted([*parts, lock, fresh]), questions)
    assert (outcome.parts, outcome.journals, outcome.locks) == (3, 1, 1)
    assert (tmp_path / "m.jsonl").read_bytes() == whole
    for alone, what in ((lock, "a run's lock file"), (fresh, "a fresh run's journal, not yet in place")):
        with pytest.raises(ConfigError) as refused:
            merge_files(str(tmp_path / "m.jsonl"), [parts[0], alone], questions)
        assert str(refused.value) == (f"{alone}: {what}, not an answers file: give the answers file it is kept "
                                      f"beside ({alone.split('.journal')[0].removesuffix('.lock')}), which the "
                                      "rerun of its job writes")


def sharded_job(tmp_path, demo_model, n=24, count=3):
    """(the question file, the shards' answers files, run settings): each shard of `n` questions
    answered by a real run (the fake engine answering), its journal beside it."""
    from fake_engine import Fake
    from ggbatch import build_config
    from ggbatch.runner.job import run_job
    questions = write_questions(tmp_path / "q.jsonl", n)
    settings = {"model": demo_model, "input": str(questions), "output": str(tmp_path / "a.jsonl"), "max_tokens": 4}
    for i in range(count):
        run_job(build_config([("t", {**settings, "shard": f"{i}/{count}"})]), engine_factory=Fake(), progress="off")
    return str(questions), [str(tmp_path / f"a.shard-{i}-of-{count}.jsonl") for i in range(count)], settings


RERUN = """import sys
from fake_engine import Fake
from ggbatch import build_config
from ggbatch.runner.job import run_job
run_job(build_config([("t", {"model": sys.argv[1], "input": sys.argv[2], "output": sys.argv[3], "max_tokens": 4,
                              "shard": "1/3", "workers": 1})]), engine_factory=Fake(slow=0.05), progress="off")
"""


def journal_lines(path):
    with open(path, "rb") as f:
        return f.read().count(b"\n")


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_part_whose_run_is_going_is_refused_and_one_stopped_before_writing_is_said(tmp_path, demo_model):
    """A shard rerun on a grown question file: while it runs, its answers file is the last run's and
    its journal grows past it (merged, exit 0, no word); killed, its journal holds answers that no
    answers file has (merged, exit 0, no word)."""
    questions, parts, settings = sharded_job(tmp_path, demo_model)
    grown = write_questions(tmp_path / "q2.jsonl", 20_000)
    journal = f"{parts[1]}.journal.jsonl"
    before = journal_lines(journal)
    rerun = subprocess.Popen([sys.executable, "-c", RERUN, settings["model"], str(grown), settings["output"]],
                             cwd=ROOT / "tests", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while journal_lines(journal) < before + 20 and rerun.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rerun.poll() is None, rerun.stderr.read().decode() if rerun.stderr else ""
        with pytest.raises(ConfigError) as refused:
            merge_files(str(tmp_path / "m.jsonl"), parts, questions)
        assert str(refused.value) == (f"{parts[1]}: its run is still going (pid {rerun.pid} holds its lock "
                                      f"{parts[1]}.lock): merge once that run has ended")
        assert not (tmp_path / "m.jsonl").exists()
    finally:
        rerun.kill()
        rerun.wait(timeout=60)
    lacks = journal_lines(journal) - before  # the rerun's answers, all of questions the part lacks
    outcome = merge_files(str(tmp_path / "m.jsonl"), sorted([*parts, f"{parts[1]}.lock"]), questions)
    assert outcome.problems() == [f"{parts[1]}: its journal holds {lacks} answers it lacks ({journal} was written "
                                  "after it: a run of it stopped before writing its answers); rerun its shard to "
                                  "write them"]
    r = ggbatch("merge", "--output", tmp_path / "m2.jsonl", *parts, timeout=60)
    assert r.returncode == 1 and f"its journal holds {lacks} answers it lacks" in r.stderr


def journal_of_shard(part, shard):
    """The first line of the journal a run of `shard` leaves beside its part (what merge reads of it)."""
    fingerprint = {"model": "abc", "max_tokens": 4, "shard": shard}
    with open(f"{part}.journal.jsonl", "w") as f:
        f.write(json.dumps({"ggbatch_journal": 1, "fingerprint": fingerprint}) + "\n")


def renamed(tmp_path, parts, shards):
    """The parts copied under names that do not say their shards, each with its run's journal."""
    copies = []
    for i, (part, shard) in enumerate(zip(parts, shards)):
        copy = str(tmp_path / f"s{i}.jsonl")
        shutil.copy(part, copy)
        journal_of_shard(copy, shard)
        copies.append(copy)
    return copies


def test_the_split_is_taken_from_the_parts_journals(tmp_path):
    """Parts renamed (s0.jsonl, s1.jsonl) merged without --input with exit 0 and no word of the
    shard missing, or of their being shards of two splits: their journals say their shards."""
    _, _, parts = write_job(tmp_path, "jsonl")
    (tmp_path / "halves").mkdir()
    _, _, halves = write_job(tmp_path / "halves", "jsonl", count=2)
    out = str(tmp_path / "m.jsonl")
    outcome = merge_files(out, renamed(tmp_path, parts[:2], ["0/3", "1/3"]))
    assert outcome.problems() == ["no part is of shard 2/3 (as the parts' journals and names say)"]
    whole = merge_files(out, renamed(tmp_path, parts, ["0/3", "1/3", "2/3"]))  # one row failed, as the run said
    assert whole.problems() == ["1 question has no answer in the parts (the rows say why)"]
    two = renamed(tmp_path, [parts[0], halves[1]], ["0/3", "1/2"])
    with pytest.raises(InputError, match=f"parts of two splits: {two[0]} is shard 0/3, {two[1]} is shard 1/2"):
        merge_files(out, two)
    journal_of_shard(parts[1], "2/3")  # a part named for another shard than its run answered
    with pytest.raises(InputError) as refused:
        merge_files(out, parts)
    assert str(refused.value) == (f"{parts[1]}: its name says shard 1/3, its journal that its run answered shard "
                                  "2/3: name each part after the shard it holds")


def edit(path, qid, **fields):
    """The question file with one record's fields changed, as an editor leaves it (a later mtime)."""
    time.sleep(0.05)  # the file's mtime after the run's answers file's, as an edit made later
    records = [json.loads(line) for line in path.read_text().splitlines()]
    write_jsonl(path, [{**r, **fields} if r["questionID"] == qid else r for r in records])


@pytest.mark.model
@pytest.mark.timeout(300)
def test_an_answer_made_for_an_earlier_version_of_its_question_is_said(tmp_path, demo_model):
    """A question edited between the runs of two shards: its answer in the first shard is the old
    question's (the first shard's rerun would answer it again), and was merged with --input as if
    every question was accounted for, exit 0."""
    from fake_engine import Fake
    from ggbatch import build_config
    from ggbatch.runner.job import run_job
    questions, parts, settings = sharded_job(tmp_path, demo_model, count=2)
    path = tmp_path / "q.jsonl"
    qid = next(f"q{i}" for i in range(24) if shard_of(f"q{i}", 2) == 0)
    edit(path, qid, question="EDITED: name three colours")
    out = str(tmp_path / "m.jsonl")
    assert merge_files(out, parts, questions).problems() == [
        f"{parts[0]}: 1 of its answers was made for another version of its question than {questions} holds now "
        f"('{qid}', as its journal says; {questions} was changed after {parts[0]} was written): rerun its shard "
        "to answer it again"]
    assert merge_files(out, parts).problems() == []  # without the question file nothing says which version
    r = ggbatch("merge", "--input", questions, "--output", out, *parts, timeout=60)
    assert r.returncode == 1 and "was made for another version of its question" in r.stderr
    rerun = build_config([("t", {**settings, "shard": "0/2"})])
    said = run_job(rerun, engine_factory=Fake(), progress="off").as_json()["questions"]
    assert said["from_journal"] == said["records"] - 1  # the edited question answered again
    assert merge_files(out, parts, questions).problems() == []
    # A field the prompt does not read: the rerun keeps the answer, which is the question's still.
    edit(path, qid, note="checked")
    assert "1 of its answers was made for another version" in merge_files(out, parts, questions).problems()[0]
    run_job(rerun, engine_factory=Fake(), progress="off")
    assert merge_files(out, parts, questions).problems() == []
