"""Question files at the edges of what a user hands ggbatch: questions piped in (`--input -`,
`/dev/stdin`, a process substitution), which can be read only once; a question field whose name
Jinja cannot write ("Prompt Text", "1q": a spreadsheet's column); a spreadsheet workbook given as
it is; a JSON Lines object left open. The readers first, then `ggbatch run` on the demo model."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile

import pytest

from ggbatch.runner.config.job_file import load_job_file
from ggbatch.runner.errors import ConfigError, InputError
from ggbatch.runner.files.inputs import read_records
from ggbatch.runner.files.piped import STDIN_NAME, readable_input
from ggbatch.runner.questions.prompts import PromptBuilder
from helpers import ROOT, ggbatch_command
from helpers import ggbatch as cli

LINES = [{"questionID": f"u{i}", "question": f"Once upon a time a {w} was", "answer": "x"}
         for i, w in enumerate(["cat", "dog", "sun"])]
JSONL = "".join(json.dumps(r) + "\n" for r in LINES)
OPEN_OBJECT = '{"questionID":"a","question":"Once upon a time"}\n{"questionID":"b","question":"Lily was"\n'


def copies_in(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".ggbatch-input-"))


def error_of(path, **kw):
    with pytest.raises(InputError) as err:
        read_records(str(path), **kw)
    return str(err.value)


def fifo_with(tmp_path, data: bytes):
    """A named pipe a thread writes `data` into (once: a second reader finds nothing)."""
    path = tmp_path / "pipe"
    os.mkfifo(path)

    def write():
        with open(path, "wb") as f:
            f.write(data)

    threading.Thread(target=write, daemon=True).start()
    return str(path)


# ---- questions piped in: copied once, read as often as the run reads them

@pytest.mark.timeout(30)
def test_a_pipe_is_copied_and_read_whole_then_the_copy_goes(tmp_path):
    pipe = fifo_with(tmp_path, JSONL.encode())
    with readable_input(pipe, str(tmp_path / "answers.json")) as name:
        assert name == pipe  # messages name the pipe as given
        (copy,) = copies_in(tmp_path)
        # read several times over, as a run reads it (format, longest line, records)
        assert [r.qid for r in read_records(name)] == ["u0", "u1", "u2"]
        assert [r.qid for r in read_records(name)] == ["u0", "u1", "u2"]
    assert copies_in(tmp_path) == []


HOLDER = ("import sys, time\nfrom ggbatch.runner.files.piped import readable_input\n"
          "with readable_input('-', sys.argv[1]):\n    print('copied', flush=True)\n    time.sleep(60)\n")


@pytest.mark.timeout(60)
def test_the_copy_of_a_run_killed_with_9_goes_with_the_next_copy_and_a_living_runs_stays(tmp_path):
    runs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / f"a{i}.json")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True) for i in range(2)]
    try:
        for run in runs:
            run.stdin.write(JSONL)
            run.stdin.close()
            assert run.stdout.readline() == "copied\n"
        runs[0].kill()
        runs[0].wait()
        assert len(left := copies_in(tmp_path)) == 2
        for name in left:  # both old enough to be taken for abandoned, were no run holding them
            os.utime(tmp_path / name, (time.time() - 60, time.time() - 60))
        with readable_input(fifo_with(tmp_path, JSONL.encode()), str(tmp_path / "answers.json")):
            assert len(copies_in(tmp_path)) == 2  # the living run's, and this one's
        assert len(copies_in(tmp_path)) == 1 and runs[1].poll() is None
    finally:
        runs[1].kill()
        runs[1].wait()


@pytest.mark.timeout(30)
def test_standard_input_is_named_stdin_and_the_copy_goes_on_an_error(tmp_path, monkeypatch):
    read, write = os.pipe()
    os.write(write, OPEN_OBJECT.encode())
    os.close(write)
    monkeypatch.setattr("sys.stdin", os.fdopen(read, "r"))
    with pytest.raises(InputError) as err:
        with readable_input("-", str(tmp_path / "answers.json")) as name:
            assert name == STDIN_NAME
            read_records(name)
    assert str(err.value) == "<stdin>:2: malformed JSON: Expecting ',' delimiter (column 40)"
    assert copies_in(tmp_path) == []


@pytest.mark.timeout(30)
def test_a_terminal_is_refused_rather_than_waited_on(tmp_path):
    leader, follower = os.openpty()
    try:
        with pytest.raises(InputError, match="the input is a terminal; pipe the questions in"):
            with readable_input(os.ttyname(follower), str(tmp_path / "answers.json")):
                pass
    finally:
        os.close(leader)
        os.close(follower)
    assert copies_in(tmp_path) == []


def test_a_regular_file_is_read_in_place(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(JSONL)
    with readable_input(str(path), str(tmp_path / "answers.json")) as name:
        assert name == str(path) and copies_in(tmp_path) == []


def test_a_job_file_may_name_standard_input(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: m.gguf\ninput: '-'\noutput: a.json\n")
    flat = load_job_file(str(job))
    assert flat["input"] == "-" and flat["output"] == str(tmp_path / "a.json")


# ---- a question field of any name

@pytest.mark.parametrize("field", ["Prompt Text", "1q", "question-text", "a.b"])
def test_the_question_field_may_be_any_column_name(field):
    builder = PromptBuilder(None, question_field=field)
    assert builder.user_message({field: "Once upon a time", "ID": "1"}) == "Once upon a time"


def test_a_prompt_template_still_names_fields_the_jinja_way():
    builder = PromptBuilder(None, user_template="{{ question }} ({{ topic }})", question_field="Prompt Text")
    assert builder.user_message({"question": "Why?", "topic": "cats"}) == "Why? (cats)"


def test_a_prompt_template_names_any_field_through_record():
    builder = PromptBuilder(None, user_template='{{ record["Prompt Text"] }} ({{ topic }})')
    assert builder.user_message({"Prompt Text": "Why?", "topic": "cats"}) == "Why? (cats)"
    with pytest.raises(ConfigError, match="Prompt Txt"):
        PromptBuilder(None, user_template='{{ record["Prompt Txt"] }}').user_message({"Prompt Text": "Why?"})


# ---- score and merge read their files from pipes too

ANSWERS = "".join(json.dumps({"questionID": r["questionID"], "answer": a}) + "\n"
                  for r, a in zip(LINES, ["x", "y", "x"]))


@pytest.mark.timeout(60)
def test_score_reads_gold_and_answers_from_pipes(tmp_path):
    (tmp_path / "a.jsonl").write_text(ANSWERS)
    (tmp_path / "q.jsonl").write_text(JSONL)
    piped_gold = cli("score", "--answers", tmp_path / "a.jsonl", "--gold", "-", "--extract", "exact", input=JSONL)
    assert piped_gold.returncode == 0, piped_gold.stderr
    assert "against <stdin>" in piped_gold.stdout and "all        3        2" in piped_gold.stdout
    command = " ".join(ggbatch_command("score", "--extract", "exact", "--answers", f"<(cat {tmp_path}/a.jsonl)",
                                       "--gold", f"<(cat {tmp_path}/q.jsonl)"))
    both = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert both.returncode == 0, both.stderr
    assert "all        3        2" in both.stdout
    twice = cli("score", "--answers", "-", "--gold", "-", input=JSONL)
    assert twice.returncode == 2 and "both name standard input" in twice.stderr


@pytest.mark.timeout(60)
def test_merge_reads_the_question_file_from_a_pipe(tmp_path):
    (tmp_path / "a.jsonl").write_text(ANSWERS)
    merged = cli("merge", "--output", tmp_path / "m.jsonl", "--input", "-", tmp_path / "a.jsonl", input=JSONL)
    assert merged.returncode == 0, merged.stderr
    assert "in the order of <stdin>" in merged.stdout
    assert ids_in(tmp_path / "m.jsonl") == ["u0", "u1", "u2"]


# ---- a spreadsheet workbook, and a JSON Lines object left open

def workbook(path, entries):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in entries:
            z.writestr(name, text)
    return path


XLSX = [("[Content_Types].xml", "<Types/>"), ("xl/workbook.xml", "<workbook/>")]
ODS = [("mimetype", "application/vnd.oasis.opendocument.spreadsheet"), ("content.xml", "<doc/>")]
SHEET = "a spreadsheet workbook (Excel or OpenDocument), not text; save it as CSV (UTF-8) and give that file"


@pytest.mark.parametrize("name,entries", [("q.xlsx", XLSX), ("q.ods", ODS), ("q.csv", XLSX), ("q", ODS)])
@pytest.mark.parametrize("fmt", [None, "csv", "jsonl", "json"])
def test_a_workbook_is_named_a_spreadsheet(tmp_path, name, entries, fmt):
    path = workbook(tmp_path / name, entries)
    assert error_of(path, fmt=fmt) == f"{path}: {SHEET}"


def test_an_old_excel_workbook_is_named_a_spreadsheet(tmp_path):
    path = tmp_path / "q.xls"
    path.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504))
    assert error_of(path) == f"{path}: {SHEET}"


def test_a_zip_of_questions_says_unzip_it(tmp_path):
    path = workbook(tmp_path / "q.jsonl.zip", [("q.jsonl", JSONL)])
    assert error_of(path).startswith(f"{path}: a ZIP archive, not text; unzip it")


@pytest.mark.parametrize("name,fmt,text", [
    ("q.jsonl", None, OPEN_OBJECT),
    ("crlf.jsonl", None, OPEN_OBJECT.replace("\n", "\r\n")),
    ("batch.jsonl", "openai", '{"custom_id": "a", "body": {"messages": []}}\n{"custom_id": "b", "body": {}\n'),
])
def test_an_object_left_open_is_named_at_the_end_of_its_line(tmp_path, name, fmt, text):
    path = tmp_path / name
    path.write_bytes(text.encode())
    column = len(text.split("\n")[1].rstrip("\r")) + 1
    assert error_of(path, fmt=fmt) == f"{path}:2: malformed JSON: Expecting ',' delimiter (column {column})"


# ---- end to end: `ggbatch run` on the demo model

def run(model, *args, timeout=240, **kwargs):
    return cli("run", "--model", model, "--max-tokens", 4, "--progress", "off", *args, timeout=timeout, **kwargs)


def ids_in(path):
    text = path.read_text()
    rows = json.loads(text) if text.lstrip().startswith("[") else list(map(json.loads, text.splitlines()))
    return [r.get("questionID", r.get("custom_id")) for r in rows]


def request(qid, text):
    return {"custom_id": qid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": text}], "max_tokens": 4}}


PIPED = {
    "jsonl": JSONL,
    "json": json.dumps(LINES),
    "csv": "questionID,question\n" + "".join(f"{r['questionID']},{r['question']}\n" for r in LINES),
    "openai": "".join(json.dumps(request(r["questionID"], r["question"])) + "\n" for r in LINES),
}


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", list(PIPED))
def test_run_answers_questions_piped_to_standard_input_and_resumes(tmp_path, demo_model, fmt):
    out = tmp_path / "answers.jsonl"
    first = run(demo_model, "--input", "-", "--output", out, input=PIPED[fmt])
    assert first.returncode == 0, first.stderr
    assert "answered   3/3 records" in first.stdout
    assert ids_in(out) == ["u0", "u1", "u2"]
    again = run(demo_model, "--input", "-", "--output", out, "--input-format", fmt, input=PIPED[fmt])
    assert again.returncode == 0, again.stderr
    assert "answered   3/3 records, 3 from the journal" in again.stdout  # the same bytes: nothing asked again
    assert copies_in(tmp_path) == []


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_reads_dev_stdin_and_a_process_substitution(tmp_path, demo_model):
    (tmp_path / "q.jsonl").write_text(JSONL)
    out = tmp_path / "answers.json"
    r = run(demo_model, "--input", "/dev/stdin", "--output", out, input=JSONL)
    assert r.returncode == 0, r.stderr
    assert ids_in(out) == ["u0", "u1", "u2"]
    command = " ".join(ggbatch_command("run", "--model", demo_model, "--max-tokens", 4, "--progress", "off",
                                       "--output", out, "--input"))
    r = subprocess.run(["bash", "-c", f"{command} <(cat {tmp_path}/q.jsonl)"], cwd=ROOT, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "answered   3/3 records, 3 from the journal" in r.stdout
    assert copies_in(tmp_path) == []


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_names_stdin_in_errors_and_scores_piped_questions(tmp_path, demo_model):
    bad = run(demo_model, "--input", "-", "--output", tmp_path / "a.json", input=OPEN_OBJECT)
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("ggbatch: error: <stdin>:2: malformed JSON: Expecting ',' delimiter "
                                  "(column 40)")
    scored = run(demo_model, "--input", "-", "--output", tmp_path / "a.json", "--score", input=JSONL)
    assert scored.returncode == 0, scored.stderr
    assert "accuracy" in scored.stdout.lower() or "score" in scored.stdout.lower()
    assert "has no gold" not in scored.stdout and "not found" not in scored.stderr
    assert copies_in(tmp_path) == []


def started_copying(proc, folder, timeout=60):
    deadline = time.monotonic() + timeout
    while not copies_in(folder):
        assert proc.poll() is None and time.monotonic() < deadline, "the run never started reading its input"
        time.sleep(0.05)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("second_signal", [True, False])
def test_ctrl_c_while_questions_are_piped_in_leaves_no_copy(tmp_path, demo_model, second_signal):
    out = tmp_path / "answers.jsonl"
    proc = subprocess.Popen(ggbatch_command("run", "--model", demo_model, "--input", "-", "--output", out,
                                            "--progress", "off"),
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(JSONL.encode() + b'{"questionID": "u9", "quest')  # the writer is cut mid-line
        proc.stdin.flush()
        started_copying(proc, tmp_path)
        proc.send_signal(signal.SIGINT)
        if second_signal:  # the pipe is still open: a second stop ends the copy at once
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
        else:  # the writer goes as a terminal's Ctrl-C stops it too: what was copied may be cut
            proc.stdin.close()
        proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.stdin.close()
    assert proc.returncode == 130, err
    assert err.decode().strip().splitlines()[-1] == ("ggbatch: stopped by signal 2 while the questions were read "
                                                     "from <stdin>; nothing was answered")
    assert copies_in(tmp_path) == []
    assert not out.exists()  # nothing was answered


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("output, said", [("/dev/stdout", "not to standard output"),
                                          ("nodir/a.jsonl", "does not exist")])
def test_an_output_that_cannot_be_written_is_refused_before_the_pipe_is_read(tmp_path, demo_model, output, said):
    r = run(demo_model, "--input", "-", "--output", tmp_path / output if "/dev" not in output else output,
            input=JSONL)
    assert r.returncode == 2 and said in r.stderr and "copy" not in r.stderr
    assert copies_in(tmp_path) == []


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_while_run_scores_stops_at_once_and_is_said_as_a_stop_while_scoring(tmp_path, demo_model):
    from fake_engine import Fake
    from ggbatch import build_config
    from ggbatch.runner.job import run_job

    # Every answer in the journal first (the fake engine answers at once), so the run under test
    # only resumes, writes its answers and goes on to score 30,000 of them: time to stop it there.
    questions, out = tmp_path / "q.jsonl", tmp_path / "a.jsonl"
    questions.write_text("".join(json.dumps({"questionID": f"q{i}", "question": f"Tom has {i} apples.",
                                             "answer": str(i)}) + "\n" for i in range(30_000)))
    settings = {"model": demo_model, "input": str(questions), "output": str(out), "max_tokens": 4}
    run_job(build_config([("t", settings)]), engine_factory=Fake(), progress="off")
    proc = subprocess.Popen(ggbatch_command("run", "--model", demo_model, "--input", questions, "--output", out,
                                            "--max-tokens", 4, "--progress", "off", "--score"),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:
            if line.startswith("wrote 30000 answers"):
                break
        proc.send_signal(signal.SIGINT)  # once: the answers are all written, nothing is left to finish
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"ggbatch: stopped by signal 2 while scoring; the answers are all in {out}: score them with ggbatch "
        f"score --answers {out} --gold {questions}")
    assert "accuracy" not in stdout
    assert len(out.read_text().splitlines()) == 30_000
