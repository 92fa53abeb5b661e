import json
import os

import pytest

from ggbatch.runner.errors import OutputError
from ggbatch.runner.files.formats.rows import split_thinking
from ggbatch.runner.files.outputs import OutputSpec, Row, merge, render, write_atomic
from helpers import answer


def test_merge_restores_input_order_fans_out_aliases_and_records_failures():
    ids = ["c", "a", "b", "d"]
    answers = {"a": answer("a", " A "), "b": answer("b", error="prompt too long"), "c": answer("c", "C")}
    rows = merge(ids, answers, aliases={"d": "a"})
    assert rows == [{"questionID": "c", "answer": "C"}, {"questionID": "a", "answer": "A"},
                    {"questionID": "b", "answer": None, "error": "prompt too long"},
                    {"questionID": "d", "answer": "A"}]


def test_render_json_and_json_lines():
    rows = [Row("1", answer("1", "é"))]
    assert json.loads(render(rows, OutputSpec("json"))) == [{"questionID": "1", "answer": "é"}]
    assert render(rows, OutputSpec("jsonl")) == '{"questionID": "1", "answer": "é"}\n'


def test_write_atomic_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    write_atomic(str(target), "new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_write_that_fails_names_the_file_it_was_given_as(tmp_path):
    gone = tmp_path / "gone" / "b.json"
    with pytest.raises(OutputError, match=r"b\.json: could not write the bench table \(--json\): No such file"):
        write_atomic(str(gone), "{}", "the bench table (--json)")
    with pytest.raises(OutputError, match="could not write the answers file: "):
        write_atomic(str(gone), "[]")


@pytest.mark.parametrize("text,expected", [
    ("<think>\nadd them\n</think>\n\n4", ("add them", "\n\n4")),
    ("add them\n</think>\n4", ("add them", "\n4")),  # the template opened the block
    ("4", (None, "4")),
    ("The tag </think> closes <think> blocks", (None, "The tag </think> closes <think> blocks")),
    ("Answer: <think>x</think> 4", (None, "Answer: <think>x</think> 4")),
])
def test_split_thinking(text, expected):
    assert split_thinking(text) == expected


def test_merge_cuts_thinking_and_keeps_it_on_request():
    answers = {"a": answer("a", "<think>2+2</think> 4")}
    assert merge(["a"], answers) == [{"questionID": "a", "answer": "4"}]
    assert merge(["a"], answers, keep_thinking=True) == [{"questionID": "a", "answer": "4", "thinking": "2+2"}]


def test_written_file_gets_the_permissions_open_would_give(tmp_path):
    umask = os.umask(0o022)
    try:
        new = tmp_path / "new.json"
        write_atomic(str(new), "[]\n")
        assert new.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
        kept = tmp_path / "kept.json"
        kept.write_text("old")
        kept.chmod(0o640)
        write_atomic(str(kept), "[]\n")
        assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_text() == "[]\n"
    finally:
        os.umask(umask)
