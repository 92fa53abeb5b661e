"""A question file's JSON read strictly: what json.loads would take silently (a key written twice,
last one winning; NaN, Infinity, 1e999) is refused, naming the file, the line and what. Real
files through the readers every run uses (JSON Lines, a JSON array, OpenAI Batch requests)."""

import json

import pytest

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.inputs import read_records
from ggbatch.runner.merge.parts import read_part

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


# ---- NaN, Infinity and numbers too large for a float: the docs say numbers must be finite

@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_a_jsonl_record_are_refused_naming_the_line(tmp_path, token):
    text = f'{{"questionID": "a", "question": "Price?"}}\n{{"questionID": "b", "question": "Price?", "p": {token}}}\n'
    assert refusal(tmp_path, "n.jsonl", text) == (f"{tmp_path / 'n.jsonl'}:2: {token} is not a number JSON has; "
                                                  "numbers must be finite (nan and inf are refused)")


def test_a_number_too_large_for_a_float_is_refused_as_inf_in_a_json_array(tmp_path):
    text = '[{"questionID": "a", "question": "Price?",\n  "price": 1e999}]'
    assert refusal(tmp_path, "n.json", text) == (f"{tmp_path / 'n.json'}:1: 1e999 is too large for a number; "
                                                 "numbers must be finite (nan and inf are refused)")


def test_nan_inside_a_batch_request_is_refused(tmp_path):
    line = json.dumps({**REQUEST, "body": {**REQUEST["body"], "temperature": float("nan")}})
    assert "NaN" in line  # json.dumps writes the non-JSON token a hand-made file would hold
    assert refusal(tmp_path, "batch.jsonl", line + "\n").startswith(f"{tmp_path / 'batch.jsonl'}:1: NaN is not")


def test_finite_floats_are_read_as_before(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"questionID": "a", "question": "x", "price": 1.5e300, "tiny": -2.5e-300}\n', encoding="utf-8")
    [record] = read_records(str(path))
    assert record.fields["price"] == 1.5e300 and record.fields["tiny"] == -2.5e-300


def test_an_answers_file_s_minus_infinity_logprob_still_merges(tmp_path):
    # json.dumps spells a logprob of -inf -Infinity: ggbatch's own answers files stay readable
    row = {"questionID": "a", "answer": "x", "token_logprobs": [{"token": "x", "logprob": float("-inf")}]}
    part = tmp_path / "answers.shard-0-of-1.jsonl"
    part.write_text(json.dumps(row) + "\n", encoding="utf-8")
    [read] = read_part(str(part)).rows
    assert read.fields["token_logprobs"][0]["logprob"] == float("-inf")


# ---- an integer longer than Python's int-string limit (4300 digits): int() raises a plain ValueError

def test_an_integer_too_long_to_read_is_refused_naming_the_line(tmp_path):
    text = '{"questionID": "a", "question": "x"}\n{"questionID": "b", "question": "x", "n": ' + "9" * 5000 + "}\n"
    assert refusal(tmp_path, "q.jsonl", text) == (f"{tmp_path / 'q.jsonl'}:2: an integer of more than 4300 digits "
                                                  "is too long to read")
    text = '[{"questionID": "a", "question": "x"},\n {"question": "x",\n  "questionID": ' + "9" * 5000 + "}]"
    assert refusal(tmp_path, "q.json", text) == (f"{tmp_path / 'q.json'}:2: an integer of more than 4300 digits "
                                                 "is too long to read")


def test_an_answers_file_s_integer_too_long_to_read_is_refused(tmp_path):
    part = tmp_path / "answers.shard-0-of-1.jsonl"
    part.write_text('{"questionID": "a", "answer": "x"}\n{"questionID": ' + "9" * 5000 + ', "answer": "x"}\n')
    with pytest.raises(InputError, match=r"shard-0-of-1.jsonl:2: an integer of more than 4300 digits"):
        read_part(str(part))
