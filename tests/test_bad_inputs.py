"""Bad input: the real runner on a real model, fed broken question files, flags, job files and
models (one line, exit 2, nothing overwritten), and questions its tokenizer cannot take (they
fail alone). Every run here has a hard timeout; a hang is a failure."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from helpers import ggbatch_command, journaled

pytestmark = [pytest.mark.timeout(180), pytest.mark.model, pytest.mark.slow]


def _unknown_architecture(path):
    import gguf

    w = gguf.GGUFWriter(str(path), "no-such-arch")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


OPENAI_OUTPUT_LINE = json.dumps({"id": "batch_req_1", "custom_id": "q1", "response": {
    "status_code": 200, "request_id": "req_1", "body": {"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}},
    "error": None}) + "\n"

BAD = [
    # (name, file contents or builder, extra flags, expected message fragment)
    ("malformed.jsonl", '{"questionID": "1", "question": "a"}\n{"questionID": 2, "question": }\n', [],
     "malformed.jsonl:2: malformed JSON"),
    ("noid.jsonl", '{"question": "a"}\n', [], "noid.jsonl:1: record has no 'questionID'"),
    ("noquestion.json", '[{"questionID": "1"}]', [], "noquestion.json:1: record has no 'question' (fields.question)"),
    ("dups.jsonl", '{"questionID": "a", "question": "x"}\n{"questionID": "a", "question": "y"}\n', [],
     "duplicate questionID: 'a' (lines 1 and 2)"),
    ("latin1.jsonl", b'{"questionID": "1", "question": "caf\xe9"}\n', [], "latin1.jsonl:1: not UTF-8"),
    ("types.jsonl", '{"questionID": "1", "question": ["a"]}\n', [],
     "'question' must be a string or a conversation (a list of messages, each an object with a role and a "
     "content), got list holding str"),
    ("ok.jsonl", None, ["--workers", "zero"], "workers: must be an integer or auto, got 'zero'"),
    ("ok.jsonl", None, ["--temperature", "-1"], "sampling.temperature: must be >= 0.0, got '-1'"),
    ("ok.jsonl", None, ["--model", "MISSING"], "missing.gguf: model file not found"),
    ("ok.jsonl", None, ["--model", "NOTGGUF"], "not a GGUF file"),
    ("ok.jsonl", None, ["--model", "BADARCH"], "model architecture 'no-such-arch' is unknown to this llama.cpp"),
    ("ok.jsonl", None, ["--model", "TRUNCATED"], "truncated.gguf: the model file is truncated or corrupt (tensor"),
    ("ok.jsonl", None, ["--output", "NODIR"], "does not exist"),
    ("ok.jsonl", None, ["JOB"], "unknown key 'temprature' in sampling (did you mean 'temperature'?)"),
    # an id field the answers rows write themselves would be overwritten by them: refused before any worker starts
    ("idanswer.jsonl", '{"answer": "q1", "question": "a"}\n', ["--id-field", "answer"],
     "fields.id (--id-field): 'answer' is one of the fields ggbatch writes in answers rows"),
    ("iderror.csv", 'error,question\nq1,a\n', ["--id-field", "error", "--output-format", "csv"],
     "fields.id (--id-field): 'error' is one of the fields"),
    ("idanswer.jsonl", '{"answer": "q1", "question": "a"}\n',  # OpenAI Batch output cannot clash; its errors file can
     ["--id-field", "answer", "--output-format", "openai", "--errors-output", "ERRCSV"], "fields.id (--id-field)"),
    # a batch's answers given as its requests: said so, whether read as questions or as requests
    ("batch.out.jsonl", OPENAI_OUTPUT_LINE, [], "batch.out.jsonl:1: an OpenAI Batch output line (answers"),
    ("batch.out.jsonl", OPENAI_OUTPUT_LINE, ["--input-format", "openai"],
     "batch.out.jsonl:1: an OpenAI Batch output line (answers"),
    # ...and read as CSV or a JSON array, before those readers fail on it with messages of their own
    ("batch.out.jsonl", OPENAI_OUTPUT_LINE, ["--input-format", "csv"],
     "batch.out.jsonl:1: an OpenAI Batch output line (answers"),
    ("batch.out.jsonl", OPENAI_OUTPUT_LINE * 2, ["--input-format", "csv"],
     "batch.out.jsonl:1: an OpenAI Batch output line (answers"),
    ("batch.out.jsonl", "\n" + OPENAI_OUTPUT_LINE, ["--input-format", "json"],
     "batch.out.jsonl:2: an OpenAI Batch output line (answers"),
    # ...and named .csv or .json under the default format: the same (it was "name it .jsonl", and
    # a renamed file only then said why)
    ("bo.csv", OPENAI_OUTPUT_LINE, [], "bo.csv:1: an OpenAI Batch output line (answers"),
    ("bo.json", "\n" + OPENAI_OUTPUT_LINE, [], "bo.json:2: an OpenAI Batch output line (answers"),
    # an integer past Python's int-string limit: a ValueError the readers let through as a traceback, exit 1
    ("big.jsonl", '{"questionID": "a", "question": "Hi", "x": ' + "9" * 5000 + "}\n", [],
     "big.jsonl:1: an integer of more than 4300 digits is too long to read"),
    ("bigarr.json", '[{"question": "Hi",\n  "questionID": ' + "9" * 5000 + "}]", [],
     "bigarr.json:1: an integer of more than 4300 digits is too long to read"),
]


@pytest.mark.parametrize("name,content,extra,message", BAD, ids=[f"{b[0]}-{b[3][:24]}" for b in BAD])
def test_bad_input_is_one_line_exit_2_and_overwrites_nothing(tmp_path, demo_model, name, content, extra, message):
    questions = tmp_path / name
    if content is None:
        content = '{"questionID": "1", "question": "a"}\n'
    (questions.write_bytes if isinstance(content, bytes) else questions.write_text)(content)
    out = tmp_path / "answers.json"
    out.write_text("earlier answers")
    (tmp_path / "notgguf.gguf").write_text("not a model")
    _unknown_architecture(tmp_path / "badarch.gguf")
    (tmp_path / "truncated.gguf").write_bytes(Path(demo_model).read_bytes()[:600_000])
    (tmp_path / "job.yaml").write_text("sampling:\n  temprature: 1\n")
    replace = {"MISSING": tmp_path / "missing.gguf", "NOTGGUF": tmp_path / "notgguf.gguf",
               "BADARCH": tmp_path / "badarch.gguf", "TRUNCATED": tmp_path / "truncated.gguf",
               "NODIR": tmp_path / "no" / "dir" / "a.json",
               "JOB": tmp_path / "job.yaml", "ERRCSV": tmp_path / "errors.csv"}
    job = [str(replace["JOB"])] if "JOB" in extra else []  # the job file is the positional argument
    flags = [str(replace.get(x, x)) for x in extra if x != "JOB"]
    args = ggbatch_command("run", *job, "--model", demo_model, "--input", str(questions),
                           "--output", str(out), "--max-tokens", "4", *flags)
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ggbatch: error: "), r.stderr
    assert message in lines[0]
    assert out.read_text() == "earlier answers"


TOKENIZER_TRAP = ["Once upon a time, there was a cat.", "It’s a dog.", "Lily liked to play.", "A “big” day",
                  "The sun was hot.", "Tom said {hi}", "They ate 3 apples.", "One day, a dog came."]


def test_questions_the_tokenizer_cannot_take_fail_alone_and_the_rest_is_answered(tmp_path):
    """On TinyStories-656K, a question with a character its vocabulary cannot spell used to abort the
    whole coordinator inside llama.cpp (exit 134)."""
    from conftest import MODELS, require

    model = require(MODELS / "TinyStories-656K-Q8_0.gguf",
                    "TinyStories' tokenizer, which lacks characters (and aborts on them without ggbatch's check)")
    questions, out = tmp_path / "q.jsonl", tmp_path / "answers.json"
    questions.write_text("".join(json.dumps({"questionID": f"q{i}", "question": q}) + "\n"
                                 for i, q in enumerate(TOKENIZER_TRAP)))
    args = ggbatch_command("run", "--model", str(model), "--input", str(questions),
                           "--output", str(out), "--max-tokens", "8", "--progress", "log")
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "abort" not in r.stderr.lower() and "terminate" not in r.stderr
    rows = json.loads(out.read_text())
    bad = {1: "U+2019 ’", 3: "U+201C “, U+201D ”", 5: "U+007B {, U+007D }"}
    assert [row["questionID"] for row in rows] == [f"q{i}" for i in range(len(TOKENIZER_TRAP))]
    for i, row in enumerate(rows):
        if i in bad:
            assert row == {"questionID": f"q{i}", "answer": None,
                           "error": f"the model's vocabulary has no token for {bad[i]} (and no byte fallback)"}
        else:
            assert isinstance(row["answer"], str) and row["answer"] and "error" not in row
    assert "answered   5/8 records, 3 failed" in r.stdout
    # Not journaled: a rerun tries them again (and they fail again), the others come from the journal.
    journaled_ids = [e["qid"] for e in journaled(f"{out}.journal.jsonl")]
    assert sorted(journaled_ids) == sorted(f"q{i}" for i in range(len(TOKENIZER_TRAP)) if i not in bad)
    again = subprocess.run([*args, "--report", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 1, again.stderr
    assert json.loads(out.read_text()) == rows
    assert json.loads((tmp_path / "r.json").read_text())["questions"]["from_journal"] == 5
