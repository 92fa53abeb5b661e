"""A question file's JSON read strictly: what json.loads would take silently (a key written twice,
last one winning) is refused, naming the file, the line and the key. Real files through the
readers every run uses (JSON Lines, a JSON array, OpenAI Batch requests)."""

import json

import pytest

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.inputs import read_records

REQUEST = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
           "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}}


def refusal(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_records(str(path))
    return str(err.value)


# ---- a key written twice

def test_an_id_written_twice_in_a_jsonl_record_is_refused_naming_line_and_key(tmp_path):
    text = '{"questionID": "ok", "question": "x"}\n{"questionID": "a", "question": "x", "questionID": "b"}\n'
    message = refusal(tmp_path, "q.jsonl", text)
    assert message == f"{tmp_path / 'q.jsonl'}:2: the record names key 'questionID' twice"


def test_a_question_written_twice_in_a_json_array_is_refused_at_the_record_s_line(tmp_path):
    text = ('[{"questionID": "a", "question": "ok"},\n {"questionID": "b",\n'
            '  "question": "first", "question": "second"}]')
    assert refusal(tmp_path, "q.json", text) == f"{tmp_path / 'q.json'}:2: the record names key 'question' twice"


def test_a_key_written_twice_inside_a_batch_request_s_body_is_refused(tmp_path):
    line = json.dumps(REQUEST).replace('"content": "Hi"', '"content": "Hi", "content": "Bye"')
    message = refusal(tmp_path, "batch.jsonl", json.dumps(REQUEST).replace("r1", "r0") + "\n" + line + "\n")
    assert message == f"{tmp_path / 'batch.jsonl'}:2: the record names key 'content' twice"


def test_the_same_key_in_two_different_objects_is_fine(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"questionID": "a", "question": "x", "meta": {"questionID": "inner"}}\n', encoding="utf-8")
    [record] = read_records(str(path))
    assert record.qid == "a" and record.fields["meta"] == {"questionID": "inner"}
