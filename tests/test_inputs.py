import json

import pytest

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.inputs import detect_format, read_records


def write(tmp_path, name, text, binary=False):
    p = tmp_path / name
    (p.write_bytes if binary else p.write_text)(text)
    return str(p)


def test_jsonl_keeps_order_and_string_ids(tmp_path):
    path = write(tmp_path, "q.jsonl", '{"questionID": 7, "question": "a"}\n\n{"questionID": "007", "question": "b"}\n')
    recs = read_records(path)
    assert [r.qid for r in recs] == ["7", "007"]
    assert [r.line for r in recs] == [1, 3]
    assert recs[1].fields["question"] == "b"


def test_json_array_with_line_numbers(tmp_path):
    path = write(tmp_path, "q.json",
                 '[\n {"questionID": "a", "question": "x"},\n {"questionID": "b", "question": "y"}\n]\n')
    assert [(r.qid, r.line) for r in read_records(path)] == [("a", 2), ("b", 3)]


def test_json_array_elements_of_many_lines_each_say_the_line_they_start_on(tmp_path):
    """Counted on from the element before (a 20,000-record array took 6 s when each element
    counted its line breaks from the file's start)."""
    records = [{"questionID": f"q{i}", "question": "line\n" * (i % 3) + "end"} for i in range(50)]
    path = write(tmp_path, "q.json", "[\n" + ",\n".join(json.dumps(r, indent=1) for r in records) + "\n]\n")
    starts = [2]
    for r in records[:-1]:
        starts.append(starts[-1] + json.dumps(r, indent=1).count("\n") + 1)
    assert [(r.qid, r.line) for r in read_records(path)] == [(f"q{i}", starts[i]) for i in range(50)]


def test_custom_field_names(tmp_path):
    path = write(tmp_path, "q.jsonl", '{"id": "q1", "prompt": "hello"}\n')
    assert read_records(path, id_field="id", question_field="prompt")[0].qid == "q1"


def test_nel_inside_a_string_is_not_a_line_break(tmp_path):
    record = json.dumps({"questionID": "1", "question": "a\u0085b"}, ensure_ascii=False)
    path = write(tmp_path, "q.jsonl", record + "\n")
    assert read_records(path)[0].fields["question"] == "a\u0085b"


@pytest.mark.parametrize("name,text,message", [
    ("q.jsonl", '{"questionID": "1", "question": "a"}\n{"questionID": "2", "question": \n',
     "q.jsonl:2: malformed JSON"),
    # the record's own fields are named, so a file whose id or question is called otherwise says which
    ("q.jsonl", '{"id": 1, "question": "a"}\n', "q.jsonl:1: record has no 'questionID' (fields.id); its fields: "
     "'id', 'question'"),
    ("q.jsonl", '{"questionID": "1", "text": "a"}\n', "q.jsonl:1: record has no 'question' (fields.question); "
     "its other fields: 'text'"),
    ("q.jsonl", '{"questionID": "1"}\n', "q.jsonl:1: record has no 'question' (fields.question); it has no other "
     "fields"),
    ("q.jsonl", '{}\n', "q.jsonl:1: record has no 'questionID' (fields.id); it has no fields"),
    ("q.jsonl", '{"questionID": "1", "question": 5}\n', "'question' must be a string"),
    ("q.jsonl", '{"questionID": [1], "question": "a"}\n', "'questionID' must be a string or an integer"),
    ("q.jsonl", '{"questionID": "1", "question": "  "}\n', "'question' is empty"),
    ("q.jsonl", '["a"]\n', "looks like a JSON array"),
    ("q.json", '{"questionID": "1", "question": "a"}\n', "must hold a JSON array"),
    ("q.json", '[{"questionID": "1", "question": "a"} {"questionID": "2"}]', "expected ',' or ']'"),
    ("q.jsonl", '"just a string"\n', "must be a JSON object"),
    # a format under another's extension is named, with what to do (it was a CSV-header error, or
    # "malformed JSON: Expecting value")
    ("q.csv", '{"questionID": "a", "question": "Once"}\n', "q.csv:1: a .csv file holds comma-separated rows under "
     "a header line, but this looks like JSON Lines; name it .jsonl (or give --input-format jsonl)"),
    ("q.csv", '[{"questionID": "a", "question": "Once"}]\n', "looks like a JSON array; name it .json"),
    ("q.jsonl", 'questionID,question\na,Once\n', "q.jsonl:1: a .jsonl file holds one JSON object per line, "
     "but this looks like CSV; name it .csv (or give --input-format csv)"),
    ("q.json", 'questionID,question\na,Once\n', "looks like CSV; name it .csv"),
])
def test_bad_input_names_file_and_line(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(InputError) as err:
        read_records(path)
    assert message in str(err.value)
    assert str(err.value).startswith(path)


@pytest.mark.parametrize("name,text,hint", [
    # a dataset's own name for the id or the question, or the job's name spelt as a spreadsheet spells it
    ("q.jsonl", '{"id": 1, "question": "a"}\n', "; if 'id' is the id, set fields.id: id (--id-field id)"),
    ("q.jsonl", '{"questionID": 1, "prompt": "a"}\n',
     "; if 'prompt' is the question, set fields.question: prompt (--question-field prompt)"),
    ("q.csv", "ID,Question\n1,a\n", "; if 'ID' is the id, set fields.id: ID (--id-field ID)"),
    ("q.csv", "questionID;Question Text\n1;a\n",
     "; if 'Question Text' is the question, set fields.question: Question Text (--question-field 'Question Text')"),
    ("q.jsonl", '{"question_id": 1, "question": "a"}\n',
     "; if 'question_id' is the id, set fields.id: question_id (--id-field question_id)"),
    # two likely fields, or none: no guess
    ("q.jsonl", '{"questionID": 1, "prompt": "a", "text": "b"}\n', "its other fields: 'prompt', 'text'"),
    ("q.jsonl", '{"questionID": 1, "gold": "a"}\n', "its other fields: 'gold'"),
])
def test_a_missing_field_names_the_likely_one_and_its_setting(tmp_path, name, text, hint):
    with pytest.raises(InputError) as err:
        read_records(write(tmp_path, name, text))
    assert str(err.value).endswith(hint)


def test_the_first_duplicate_id_is_named_with_both_lines(tmp_path):
    lines = "".join(json.dumps({"questionID": q, "question": "x"}) + "\n" for q in ["a", "b", "a", "c", "b"])
    with pytest.raises(InputError, match=r"duplicate questionID: 'a' \(lines 1 and 3\)$"):
        read_records(write(tmp_path, "q.jsonl", lines))


def test_non_utf8_names_line(tmp_path):
    content = b'{"questionID": "1", "question": "a"}\n{"questionID": "2", "question": "\xff"}\n'
    path = write(tmp_path, "q.jsonl", content, binary=True)
    with pytest.raises(InputError, match=r"q.jsonl:2: not UTF-8"):
        read_records(path)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="input file not found"):
        read_records(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.json"])
def test_empty_file_is_no_questions(tmp_path, name):
    assert read_records(write(tmp_path, name, "")) == []


def test_format_sniffed_for_other_extensions():
    assert detect_format("q.txt", "  [ ]") == "json"
    assert detect_format("q.txt", '{"a": 1}\n') == "jsonl"


def test_a_question_file_is_counted_in_the_pass_that_finds_its_longest_line(tmp_path):
    from ggbatch.runner.files.inputs import open_question_file

    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text("".join(f'{{"questionID": "{i}", "question": "{"x" * i}"}}\n' for i in range(5)))
    stream = open_question_file(str(jsonl))
    assert (stream.records_guess, stream.longest_line) == (5, len('{"questionID": "4", "question": "xxxx"}\n'))
    csv = tmp_path / "q.csv"
    csv.write_bytes(b"questionID,question\r1,a\r2,bb\r")  # lone CR line ends: the header is not a record
    assert open_question_file(str(csv)).records_guess == 2
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert open_question_file(str(empty)).records_guess == 0


def _long_file(path, n=12000):
    """n records of about 350 bytes: several of the reader's 1 MiB reads."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"questionID": f"q{i}", "question": f"What is {i}?", "pad": "y" * 300}) + "\n")
    return path.stat().st_size


@pytest.mark.parametrize("cut", ["inside a line", "at a line's end"])
def test_a_streamed_file_cut_short_during_the_run_is_said_as_changed(tmp_path, cut):
    from ggbatch.runner.files.inputs import open_question_file

    path = tmp_path / "q.jsonl"
    size = _long_file(path)
    records = open_question_file(str(path)).records
    next(records)  # the first read is made: the run has begun
    lines_end = len("".join(path.read_text().splitlines(keepends=True)[:8000]))
    now = lines_end + (100 if cut == "inside a line" else 0)
    with open(path, "r+") as f:
        f.truncate(now)
    with pytest.raises(InputError) as err:
        list(records)
    assert str(err.value) == (f"{path}: the question file changed during the run (it is now {now:,} bytes, "
                              f"was {size:,}): run again once it is whole")


def test_a_streamed_file_rewritten_in_place_as_large_or_larger_is_said_as_changed(tmp_path):
    """`cat other.jsonl > q.jsonl` during a run: the reader went on from where it was in the new
    bytes, and the run ended with exit 0 on a mix of the two files' questions."""
    from ggbatch.runner.files.inputs import open_question_file

    path = tmp_path / "q.jsonl"
    _long_file(path)
    records = open_question_file(str(path)).records
    next(records)
    with open(path, "w") as f:  # truncated and written again, larger
        for i in range(13000):
            f.write(json.dumps({"questionID": f"new{i}", "question": f"Who is {i}?", "pad": "z" * 300}) + "\n")
    with pytest.raises(InputError) as err:
        list(records)
    assert str(err.value) == (f"{path}: the question file was rewritten during the run (its first bytes are not "
                              "those read at its start): run again once it is whole")


def test_a_streamed_file_grown_or_renamed_over_during_the_run_is_read_on(tmp_path):
    from ggbatch.runner.files.inputs import open_question_file

    grown, renamed = tmp_path / "grown.jsonl", tmp_path / "renamed.jsonl"
    _long_file(grown)
    _long_file(renamed)
    read_on = [open_question_file(str(grown)).records, open_question_file(str(renamed)).records]
    for records in read_on:
        next(records)
    with open(grown, "a") as f:
        f.write(json.dumps({"questionID": "extra", "question": "And 1?"}) + "\n")
    _long_file(tmp_path / "small.jsonl", 10)
    (tmp_path / "small.jsonl").replace(renamed)  # mv: the file opened is read to its end
    assert [1 + len(list(records)) for records in read_on] == [12001, 12000]
