"""No room for the answers: a journal that cannot grow (a full disk, ulimit -f) and an answers file
that cannot be written either. The real runner on the demo model, under a file size limit (the
same error path as a full disk, without mounting one). Every run has a hard timeout."""

import json
import resource
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from helpers import ggbatch_command, write_questions

pytestmark = [pytest.mark.timeout(180), pytest.mark.model, pytest.mark.slow]

LIMIT = 16 * 1024  # bytes: the journal's lines reach it first, and 300 rows of the answers file pass it too


def run(model, questions, out, limit=None):
    command = ggbatch_command("run", "--model", model, "--input", questions, "--output", out, "--max-tokens", 16,
                              "--batch-invariant", "--report", out.parent / "r.json", "-q")
    # Python ignores SIGXFSZ: a write past the limit fails with EFBIG, as one on a full disk with ENOSPC
    limited = None if limit is None else lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=limited)


def test_a_full_journal_is_said_first_when_the_answers_file_cannot_be_written_either(tmp_path, demo_model):
    """Its line was replaced by 'could not write the answers file', which never said to run the same
    command again (docs/guide/nothing-lost.md). Now it is said, and the answers file's failure after it."""
    questions = write_questions(tmp_path / "q.jsonl", 300)
    out = tmp_path / "answers.json"
    r = run(demo_model, questions, out, LIMIT)
    assert r.returncode == 2, r.stderr
    journal = f"{out}.journal.jsonl"
    assert r.stderr.splitlines() == [
        f"ggbatch: error: {journal}: cannot append to the journal (File too large); every answer written before "
        "this one is kept: make room, then run the same command again to finish; writing the answers failed "
        f"too: {out}: could not write the answers file: File too large"]
    assert not out.exists() and Path(journal).stat().st_size == LIMIT
    r = run(demo_model, questions, out)  # room again: the same command finishes the job
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 300 and all(row["answer"] is not None for row in rows)
    assert 0 < json.loads((tmp_path / "r.json").read_text())["questions"]["from_journal"] < 300
