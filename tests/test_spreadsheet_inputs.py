"""Question files as other tools write them: CSV saved by spreadsheets (semicolons, tabs, UTF-16,
CR line ends, empty trailing columns, fields longer than Python's csv default limit), OpenAI
Batch files whose first request is over a MiB, and ids that cannot be answered (empty, or a lone
surrogate). The readers first, then `ggbatch run` on a real tiny model."""

import codecs
import csv
import io
import json

import pytest

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.formats.csvfile import csv_rows, header_delimiter
from ggbatch.runner.files.formats.textfile import read_text
from ggbatch.runner.files.inputs import read_question_file, read_records
from helpers import ggbatch as cli

QUESTIONS = [("q1", "Once upon a time, there was a cat."), ("q2", "Lily liked to play; she ran."),
             ("q3", "The sun was hot.")]


def write(tmp_path, name, data):
    path = tmp_path / name
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return str(path)


def spreadsheet(rows, delimiter=",", end="\r\n", encoding="utf-8", trailing=0):
    """A file as a spreadsheet saves it: the header and rows, `trailing` empty columns after each."""
    out = io.StringIO(newline="")
    writer = csv.writer(out, delimiter=delimiter, lineterminator=end)
    for row in [("questionID", "question"), *rows]:
        writer.writerow([*row, *[""] * trailing])
    bom = {"utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}.get(encoding, b"")
    return bom + out.getvalue().encode(encoding)


def ids_and_questions(path, **kw):
    return [(r.qid, r.fields["question"]) for r in read_records(path, **kw)]


def error_of(path, **kw):
    with pytest.raises(InputError) as err:
        read_records(path, **kw)
    return str(err.value)


# ---- item 4: delimiters and encodings of spreadsheets

@pytest.mark.parametrize("delimiter", [";", "\t", "|", ","])
def test_the_header_tells_the_delimiter(tmp_path, delimiter):
    path = write(tmp_path, "q.csv", spreadsheet(QUESTIONS, delimiter))
    assert ids_and_questions(path) == QUESTIONS


@pytest.mark.parametrize("header,required,expected", [
    ("questionID;question", {"questionID": "", "question": ""}, ";"),
    ("questionID,question;notes", {}, ","),  # as many columns either way: the comma
    ("questionID,question,notes;a;b;c", {"questionID": "", "question": ""}, ","),  # only commas give both
    ("a\tb\tc,d", {}, "\t"),
    ("question", {}, ","),
    ('"question\n', {}, ","),  # a header cell with a line break: no single-line guess
])
def test_header_delimiter(header, required, expected):
    assert header_delimiter(header, required) == expected


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_with_its_byte_order_mark_is_read(tmp_path, encoding):
    # Excel's "Unicode text": UTF-16 with a byte order mark, tab-delimited, saved as .txt
    path = write(tmp_path, "q.txt", spreadsheet(QUESTIONS + [("q4", "Zoë's café")], "\t", encoding=encoding))
    qf = read_question_file(path)
    assert qf.format == "csv"
    assert [(r.qid, r.fields["question"], r.line) for r in qf.records] == [
        (q, text, n) for n, (q, text) in enumerate(QUESTIONS + [("q4", "Zoë's café")], start=2)]


def test_utf16_json_lines_array_and_gold_files_are_read(tmp_path):
    lines = "".join(json.dumps({"questionID": q, "question": t}) + "\n" for q, t in QUESTIONS)
    jsonl = write(tmp_path, "q.jsonl", codecs.BOM_UTF16_LE + lines.encode("utf-16-le"))
    text = "[" + lines.replace("\n", ",\n").rstrip(",\n") + "]"
    array = write(tmp_path, "q.json", text)
    array_16 = write(tmp_path, "q16.json", text.encode("utf-16"))
    assert ids_and_questions(jsonl) == ids_and_questions(array_16) == QUESTIONS
    assert read_text(array_16) == read_text(array)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_a_byte_order_mark_is_named(tmp_path, encoding):
    # big-endian starts with a zero byte, and its commas once made detection call a .jsonl or .json
    # file CSV ("name it .csv"), advice that cannot help
    path = write(tmp_path, "q.csv", spreadsheet(QUESTIONS, encoding=encoding)[2:])
    jsonl = write(tmp_path, "q.jsonl", '{"questionID": "1", "question": "a"}\n'.encode(encoding))
    array = write(tmp_path, "q.json", '[{"questionID": "1", "question": "a"}]'.encode(encoding))
    for name in (path, jsonl, array):
        assert error_of(name) == (f"{name}:1: UTF-16 text without a byte order mark (every other byte is zero); "
                                  "save the file as UTF-8, or as UTF-16 with its byte order mark")


def test_a_bad_utf16_file_names_its_line(tmp_path):
    data = spreadsheet(QUESTIONS, encoding="utf-16-le") + "q9,x".encode("utf-16-le") + b"\x00\xd8a\x00\n\x00"
    path = write(tmp_path, "q.csv", data)
    assert "q.csv:5: not UTF-16 text" in error_of(path)


# ---- item 4: empty ids, every format

@pytest.mark.parametrize("name,text,message", [
    ("q.csv", "questionID,question\nq1,a\n,b\nq3,c\n", "q.csv:3: 'questionID' is empty"),
    ("q.csv", "questionID;question\nq1;a\n  ;b\n", "q.csv:3: 'questionID' is empty ('  ')"),
    ("q.jsonl", '{"questionID": "q1", "question": "a"}\n{"questionID": "", "question": "b"}\n',
     "q.jsonl:2: 'questionID' is empty"),
    ("q.json", '[{"questionID": "", "question": "a"}]', "q.json:1: 'questionID' is empty"),
    ("b.jsonl", json.dumps({"custom_id": " ", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"messages": [{"role": "user", "content": "a"}]}}) + "\n",
     "b.jsonl:1: 'custom_id' is empty (' ')"),
])
def test_an_empty_id_is_an_error_naming_the_line(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    assert error_of(path).startswith(f"{path}:") and message in error_of(path)


# ---- item 11: half of a surrogate pair in an id

def request(cid, text="Once upon a time"):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": text}]}}


@pytest.mark.parametrize("name,text,message", [
    ("q.jsonl", '{"questionID": "q1", "question": "a"}\n{"questionID": "a\\ud800b", "question": "b"}\n',
     "q.jsonl:2: 'questionID' 'a\\ud800b': U+D800 at character 2 is half of a surrogate pair"),
    ("q.json", '[{"questionID": "\\udfff", "question": "a"}]', "q.json:1: 'questionID' '\\udfff': U+DFFF at"),
    ("b.jsonl", json.dumps(request("q1")) + "\n" + json.dumps(request("\ud800")) + "\n",
     "b.jsonl:2: 'custom_id' '\\ud800': U+D800 at character 1 is half"),
    ("q.jsonl", '{"id": "\\ud800", "question": "a"}\n', "q.jsonl:1: 'id' '\\ud800': U+D800 at character 1 is half"),
])
def test_a_lone_surrogate_in_an_id_is_an_error_naming_the_line(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    kw = {"id_field": "id"} if '"id"' in text else {}
    assert message in error_of(path, **kw)


# ---- item 14: CR line ends, empty trailing columns

def test_cr_line_ends_are_read_and_lines_counted_by_them(tmp_path):
    path = write(tmp_path, "q.csv", spreadsheet(QUESTIONS + [("q4", 'A "long"\rday')], end="\r"))
    assert [(r.qid, r.line) for r in read_records(path)] == [("q1", 2), ("q2", 3), ("q3", 4), ("q4", 5)]
    assert read_records(path)[3].fields["question"] == 'A "long"\rday'
    bad = write(tmp_path, "bad.csv", b"questionID,question\rq1,a\rq2,b,c\r")
    assert "bad.csv:3: 3 fields where the header (line 1) names 2 columns" in error_of(bad)
    latin1 = write(tmp_path, "l.csv", b"questionID,question\rq1,a\rq2,caf\x8e\r")  # Mac Roman
    assert "l.csv:3: not UTF-8 text (byte 0x8e at column 7)" in error_of(latin1)


def test_empty_trailing_columns_and_empty_rows_are_left_out(tmp_path):
    text = spreadsheet(QUESTIONS, trailing=2) + b",,,\r\n , ,,\r\n"  # rows of empty cells
    path = write(tmp_path, "q.csv", text)
    recs = read_records(path)
    assert [(r.qid, dict(r.fields)) for r in recs] == [(q, {"questionID": q, "question": t}) for q, t in QUESTIONS]
    # rows as hand-edited: without the trailing cells
    short = write(tmp_path, "short.csv", "questionID,question,,\nq1,a\nq2,b,\n")
    assert ids_and_questions(short) == [("q1", "a"), ("q2", "b")]


def test_a_value_under_an_unnamed_column_names_line_and_column(tmp_path):
    path = write(tmp_path, "q.csv", "questionID,question,,\nq1,a,,\nq2,b,,gold\n")
    assert "q.csv:3: column 4 holds 'gold', but the header (line 1) gives it no name" in error_of(path)
    middle = write(tmp_path, "m.csv", "questionID,,question\nq1,,a\n")
    assert "m.csv:1: the header row has an empty column name" in error_of(middle)


def test_a_scored_gold_file_from_a_spreadsheet_is_read(tmp_path):
    data = b"questionID;question;gold;\rq1;a;4;\rq2;b;5;\r"
    rows = list(csv_rows("g.csv", read_text(write(tmp_path, "g.csv", data))))
    assert rows == [(2, {"questionID": "q1", "question": "a", "gold": "4"}),
                    (3, {"questionID": "q2", "question": "b", "gold": "5"})]


# ---- item 3: fields over the csv module's default limit

def test_a_field_over_131072_characters_is_read(tmp_path):
    passage = "Once upon a time. " * 20_000  # 360,000 characters
    path = write(tmp_path, "q.csv", spreadsheet([("q1", passage), ("q2", "short")]))
    assert ids_and_questions(path) == [("q1", passage), ("q2", "short")]
    assert csv_rows("t.csv", read_text(path)).__next__()[1]["question"] == passage


# ---- item 2: an OpenAI Batch file whose first request is over a MiB

def test_openai_batch_detected_from_a_first_line_over_a_mib(tmp_path):
    long = json.dumps(request("doc", "word " * 300_000))  # 1.5 MB
    assert len(long) > 1 << 20
    path = write(tmp_path, "batch.jsonl", long + "\n" + json.dumps(request("short")) + "\n")
    qf = read_question_file(path)
    assert qf.format == "openai" and [r.qid for r in qf.records] == ["doc", "short"]
    # UTF-16, a blank line first, CRLF, and more UTF-8 bytes than characters
    wide = json.dumps(request("doc", "wörd " * 300_000), ensure_ascii=False)
    crlf = write(tmp_path, "b16.jsonl", codecs.BOM_UTF16_LE + f"\n{wide}\r\n".encode("utf-16-le"))
    assert read_question_file(crlf).format == "openai"


@pytest.mark.parametrize("name,text,fmt,message", [
    ("q.jsonl", '{"questionID": "1", "question": "a"}\nREQUEST\n', None,
     "q.jsonl:2: record has no 'questionID' (an OpenAI Batch request, but the file's first line is not one, "
     "so the file is read as questions: set input_format to openai to read it as requests)"),
    ("q.jsonl", "REQUEST\n", "jsonl", "q.jsonl:1: record has no 'questionID' (an OpenAI Batch request: set "
     "input_format to openai)"),
    ("q.json", "[REQUEST]", None, "q.json:1: record has no 'questionID' (an OpenAI Batch request: a file of "
     "requests holds one per line, JSON Lines, not an array)"),
])
def test_a_request_read_as_a_question_says_what_to_do(tmp_path, name, text, fmt, message):
    path = write(tmp_path, name, text.replace("REQUEST", json.dumps(request("r1"))))
    error = error_of(path, fmt=fmt)
    assert error == f"{tmp_path}/{message}"
    assert "leave input_format on auto" not in error


# ---- end to end: `ggbatch run` on the demo model

def ggbatch(*args, timeout=240):
    return cli(*args, timeout=timeout)


def answers(path):
    return {r["questionID"]: (r["answer"], r.get("error")) for r in map(json.loads, open(path, encoding="utf-8"))}


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_answers_a_spreadsheet_csv_as_it_answers_a_plain_one(tmp_path, demo_model):
    """Semicolons, UTF-16 with its mark, CR line ends, empty trailing columns and an empty last row,
    a field over 131,072 characters: the same answers as the plain CSV of the same questions."""
    rows = QUESTIONS + [("long", "Once upon a time. " * 10_000)]
    plain = write(tmp_path, "plain.csv", spreadsheet(rows, end="\n"))
    excel = write(tmp_path, "excel.csv", spreadsheet(rows, ";", "\r", "utf-16-le", trailing=2)
                  + ";;;\r".encode("utf-16-le"))
    got = {}
    for path in (plain, excel):
        out = tmp_path / (path.rsplit("/", 1)[1] + ".jsonl")
        r = ggbatch("run", "--model", demo_model, "--input", path, "--output", out, "--max-tokens", 8, "-q")
        assert r.returncode == 1, r.stderr  # the long question fails alone, for its length
        got[path] = answers(out)
    assert got[excel] == got[plain]
    assert list(got[excel]) == [q for q, _ in rows]
    assert all(got[excel][q][0] and got[excel][q][1] is None for q, _ in QUESTIONS)
    assert "tokens" in got[excel]["long"][1]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_refuses_a_bad_id_in_one_line(tmp_path, demo_model):
    for text, message in [('{"questionID": "q1", "question": "a"}\n{"questionID": "\\ud800", "question": "b"}\n',
                           "q.jsonl:2: 'questionID' '\\ud800': U+D800 at character 1"),
                          (json.dumps(request("\ud800")) + "\n", "q.jsonl:1: 'custom_id' '\\ud800': U+D800 at"),
                          ("questionID,question\n,a\n", "q.csv:2: 'questionID' is empty")]:
        path = write(tmp_path, "q.csv" if text.startswith("questionID") else "q.jsonl", text)
        r = ggbatch("run", "--model", demo_model, "--input", path, "--output", tmp_path / "a.jsonl")
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"ggbatch: error: {tmp_path}/{message}")


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_reads_an_openai_batch_file_whose_first_request_is_over_a_mib(tmp_path, demo_model):
    long = json.dumps(request("doc", "word " * 250_000))
    batch = write(tmp_path, "batch.jsonl", long + "\n" + json.dumps(request("short")) + "\n")
    out = tmp_path / "out.jsonl"
    r = ggbatch("run", "--model", demo_model, "--input", batch, "--output", out, "--max-tokens", 4, "-q")
    assert r.returncode == 1, r.stderr  # the long request fails alone, for its length
    lines = [json.loads(line) for line in open(out, encoding="utf-8")]
    assert [x["custom_id"] for x in lines] == ["doc", "short"]
    assert "tokens" in lines[0]["error"]["message"] and lines[1]["response"]["status_code"] == 200


def test_merge_and_score_refuse_an_id_with_half_a_surrogate_pair_naming_the_line(tmp_path):
    from ggbatch.runner.merge.parts import read_part
    from ggbatch.runner.scoring.files import read_answers

    path = write(tmp_path, "a.jsonl", '{"questionID": "q1", "answer": "4"}\n{"questionID": "\\ud800", "answer": "5"}\n')
    for read in (read_part, read_answers):
        with pytest.raises(InputError, match=r"a.jsonl:2: 'questionID' '\\ud800': U\+D800 at character 1 is half"):
            read(path)
