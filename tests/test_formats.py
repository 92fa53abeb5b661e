"""Question and answers file formats (runner/files/formats), without a model: detection, CSV in and out,
JSON rows, the errors file."""

import csv
import io
import json

import pytest

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.formats.csvfile import csv_rows, render_csv
from ggbatch.runner.files.formats.detect import detect_format, input_format, output_format
from ggbatch.runner.files.inputs import read_question_file, read_records
from ggbatch.runner.files.outputs import OutputSpec, Row, answer_rows, render, write_answers
from helpers import answer

OPENAI_LINE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"messages": [{"role": "user", "content": "hi"}]}})


def write(tmp_path, name, text):
    p = tmp_path / name
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return str(p)


@pytest.mark.parametrize("path,text,requested,expected", [
    ("q.jsonl", OPENAI_LINE + "\n", None, "openai"),  # by content
    ("batch.txt", "\n" + OPENAI_LINE + "\n", None, "openai"),
    ("q.jsonl", OPENAI_LINE + "\n", "jsonl", "jsonl"),  # the job's word wins
    ("q.jsonl", '{"questionID": "1", "question": "a"}\n', None, "jsonl"),
    ("q.json", OPENAI_LINE.join("[]"), None, "json"),  # an array is never an OpenAI Batch file
    ("q.csv", "questionID,question\n", None, "csv"),
    ("q.txt", "questionID,question\n1,a\n", None, "csv"),  # neither [ nor {: CSV
    ("q.txt", "", None, "jsonl"),
])
def test_input_format(path, text, requested, expected):
    assert input_format(path, text, requested) == expected


@pytest.mark.parametrize("path,requested,input_fmt,expected", [
    ("a.jsonl", None, "openai", "openai"),
    ("a.out", None, "openai", "openai"),
    ("a.csv", None, "openai", "csv"),
    ("a.json", None, "openai", "json"),
    ("a.jsonl", None, "csv", "jsonl"),
    ("a.txt", None, "jsonl", "json"),
    ("a.csv", None, "jsonl", "csv"),
    ("a.txt", "csv", "jsonl", "csv"),
    ("a.jsonl", "openai", "csv", "openai"),
])
def test_output_format(path, requested, input_fmt, expected):
    assert output_format(path, requested, input_fmt) == expected


def test_detect_format_keeps_its_checks():
    with pytest.raises(InputError, match="must hold a JSON array"):
        detect_format("q.json", '{"a": 1}\n')
    assert detect_format("q.txt", "  [ ]") == "json"


def test_csv_quoted_commas_and_line_breaks_with_the_line_each_record_starts_on(tmp_path):
    text = ('questionID,question,topic\r\n'
            'q1,"Once upon a time, there was",animals\r\n'
            '\r\n'
            'q2,"The dog\nran\n""home""",dogs\r\n'
            '"q,3",Lily,people\r\n')
    qf = read_question_file(write(tmp_path, "q.csv", text))
    assert qf.format == "csv"
    assert [(r.qid, r.line) for r in qf.records] == [("q1", 2), ("q2", 4), ("q,3", 7)]
    assert qf.records[1].fields == {"questionID": "q2", "question": 'The dog\nran\n"home"', "topic": "dogs"}


def test_csv_other_columns_and_field_names(tmp_path):
    path = write(tmp_path, "q.csv", "\ufeffid,prompt,gold\n7,hello,4\n")  # Excel's BOM
    (rec,) = read_records(path, id_field="id", question_field="prompt")
    assert (rec.qid, rec.fields["gold"]) == ("7", "4")


@pytest.mark.parametrize("text,message", [
    ("questionID,question\nq1,a\nq2,b,extra\n", "q.csv:3: 3 fields where the header (line 1) names 2 columns"),
    ("questionID,question\nq1,a\nq2\n", "q.csv:3: 1 fields where the header"),
    ("id,question\nq1,a\n", "q.csv:1: the header has no column 'questionID' (fields.id)"),
    ("questionID,text\nq1,a\n", "q.csv:1: the header has no column 'question' (fields.question)"),
    ("questionID,question,question\n", "q.csv:1: the header row names column 'question' twice"),
    ("questionID,question\nq1,a\nq2,\"unclosed\n", "q.csv:3: malformed CSV"),
    ("questionID,question\nq1,a\nq1,b\n", "q.csv: duplicate questionID: 'q1' (lines 2 and 3)"),
    ("questionID,question\nq1,  \n", "q.csv:2: 'question' is empty"),
])
def test_bad_csv_names_file_and_line(tmp_path, text, message):
    path = write(tmp_path, "q.csv", text)
    with pytest.raises(InputError) as err:
        read_records(path)
    assert message in str(err.value) and str(err.value).startswith(path)


def test_csv_not_utf8_names_the_line(tmp_path):
    path = write(tmp_path, "q.csv", b"questionID,question\nq1,ok\nq2,caf\xe9 au lait\n")  # Latin-1
    with pytest.raises(InputError, match=r"q.csv:3: not UTF-8 text \(byte 0xe9 at column 7\)"):
        read_records(path)


def test_csv_rows_of_an_empty_file():
    assert list(csv_rows("e.csv", "", {"questionID": "fields.id"})) == []


def test_csv_answers_round_trip_through_the_csv_module():
    answers = {"a": answer("a", ' says "hi", then\nleaves '), "b": answer("b", error="prompt too long")}
    rows = answer_rows(["a,1", "b", "c"], answers, aliases={"a,1": "a"}, unanswered="not answered: stop")
    text = render(rows, OutputSpec("csv", id_field="id"))
    assert list(csv.DictReader(io.StringIO(text, newline=""))) == [
        {"id": "a,1", "answer": 'says "hi", then\nleaves', "error": ""},
        {"id": "b", "answer": "", "error": "prompt too long"},
        {"id": "c", "answer": "", "error": "not answered: stop"}]


def test_csv_keeps_thinking_in_its_own_column():
    rows = answer_rows(["a"], {"a": answer("a", "<think>2+2</think> 4")})
    text = render(rows, OutputSpec("csv", keep_thinking=True))
    assert list(csv.reader(io.StringIO(text, newline=""))) == [["questionID", "answer", "error", "thinking"],
                                                               ["a", "4", "", "2+2"]]


def test_render_csv_writes_none_as_empty():
    assert render_csv([{"a": None, "b": 1}], ["a", "b"]) == "a,b\r\n,1\r\n"


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "openai"])
def test_errors_output_takes_the_rows_without_an_answer(tmp_path, fmt):
    rows = answer_rows(["a", "b", "c", "d"], {"a": answer("a"), "b": answer("b", error="bad"), "d": answer("d")},
                       unanswered="not answered")
    out, errors = tmp_path / "out", tmp_path / "errors"
    errors.write_text("stale")
    write_answers(str(out), rows, OutputSpec(fmt), str(errors))
    assert read_ids(out, fmt) == ["a", "d"] and read_ids(errors, fmt) == ["b", "c"]
    write_answers(str(out), rows[:1], OutputSpec(fmt), str(errors))
    assert read_ids(errors, fmt) == []  # written even when empty: never a stale one


def test_a_csv_answers_file_whose_errors_go_elsewhere_has_no_error_column(tmp_path):
    """A competition's submission file is `id,answer`: with errors_output the answers file's error
    column was always empty, and a checker that counts columns refused the file."""
    rows = answer_rows(["a", "b"], {"a": answer("a", "yes"), "b": answer("b", error="bad")})
    out, errors = tmp_path / "out.csv", tmp_path / "errors.csv"
    write_answers(str(out), rows, OutputSpec("csv", id_field="id"), str(errors))
    assert out.read_bytes() == b"id,answer\r\na,yes\r\n"
    assert errors.read_bytes() == b"id,answer,error\r\nb,,bad\r\n"


@pytest.mark.parametrize("out_fmt,errors_name,errors_fmt", [
    ("jsonl", "errs.json", "json"), ("json", "errs.jsonl", "jsonl"), ("json", "errs.csv", "csv"),
    ("csv", "errs.ndjson", "jsonl"), ("openai", "errs.jsonl", "openai"), ("csv", "errs.txt", "csv")])
def test_the_errors_file_takes_its_own_extensions_format(tmp_path, out_fmt, errors_name, errors_fmt):
    """A user names the errors file by the format they want: errs.json beside o.jsonl was an empty
    0-byte file (no valid JSON), errs.jsonl beside o.json held `[]`."""
    rows = answer_rows(["a", "b"], {"a": answer("a"), "b": answer("b", error="bad")}, unanswered="not answered")
    out, errors = tmp_path / "out", tmp_path / errors_name
    write_answers(str(out), rows, OutputSpec(out_fmt), str(errors))
    assert read_ids(out, out_fmt) == ["a"] and read_ids(errors, errors_fmt) == ["b"]
    write_answers(str(out), rows[:1], OutputSpec(out_fmt), str(errors))
    assert read_ids(errors, errors_fmt) == []  # empty, and valid in its format (json.load reads [])


def read_ids(path, fmt):
    text = path.read_text()
    if fmt == "csv":
        return [r["questionID"] for r in csv.DictReader(io.StringIO(text, newline=""))]
    rows = json.loads(text) if fmt == "json" else [json.loads(line) for line in text.splitlines()]
    return [r.get("custom_id", r.get("questionID")) for r in rows]


def test_answer_rows_fan_out_aliases_and_say_why():
    rows = answer_rows(["a", "b", "c"], {"a": answer("a")}, aliases={"b": "a"}, unanswered="none")
    assert [(r.qid, r.answer and r.answer.qid, r.error) for r in rows] == [("a", "a", None), ("b", "a", None),
                                                                          ("c", None, "none")]
    assert rows[0] == Row("a", answer("a"))
