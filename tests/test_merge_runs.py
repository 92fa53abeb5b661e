"""`ggbatch merge` and the runs that wrote its parts: the files a run keeps beside a part (its journal,
its lock) given in a glob, a part whose run is still going or stopped before writing its answers,
answers made for another version of a question, and the split the parts' journals say."""

import os
import shutil

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
