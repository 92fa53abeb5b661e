import json
import os

import pytest

from runner.errors import OutputError
from runner.outputs import check_writable, merge, render, write_atomic
from workers.protocol import Answer, FinishReason


def answer(qid, text="x", error=None):
    return Answer(qid, text, FinishReason.ERROR if error else FinishReason.STOP, 3, 2, 0, 0.1, 0.2, error)


def test_merge_restores_input_order_fans_out_aliases_and_records_failures():
    ids = ["c", "a", "b", "d"]
    answers = {"a": answer("a", " A "), "b": answer("b", error="prompt too long"), "c": answer("c", "C")}
    rows = merge(ids, answers, aliases={"d": "a"})
    assert rows == [{"questionID": "c", "answer": "C"}, {"questionID": "a", "answer": "A"},
                    {"questionID": "b", "answer": None, "error": "prompt too long"},
                    {"questionID": "d", "answer": "A"}]


def test_render_by_extension():
    rows = [{"questionID": "1", "answer": "é"}]
    assert json.loads(render(rows, "a.json")) == rows
    assert render(rows, "a.jsonl") == '{"questionID": "1", "answer": "é"}\n'


def test_write_atomic_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    write_atomic(str(target), "new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["a.json"]


def test_check_writable(tmp_path):
    check_writable(str(tmp_path / "a.json"))
    with pytest.raises(OutputError, match="does not exist"):
        check_writable(str(tmp_path / "missing" / "a.json"))
    with pytest.raises(OutputError, match="is a directory"):
        check_writable(str(tmp_path))
