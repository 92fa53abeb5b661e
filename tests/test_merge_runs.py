"""`ggbatch merge` and the runs that wrote its parts: the files a run keeps beside a part (its journal,
its lock) given in a glob, a part whose run is still going or stopped before writing its answers,
answers made for another version of a question, and the split the parts' journals say."""

import os
import shutil

import pytest

from ggbatch.runner.errors import ConfigError
from ggbatch.runner.merge.command import merge_files
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
