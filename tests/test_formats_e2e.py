"""Question and answers formats end to end through the command line, with real llama.cpp in real
worker processes: OpenAI Batch files in and out (read back with the openai package's types), CSV
in and out, and `ggbatch score` on what they produce."""

import copy
import csv
import io
import json

import pytest

from helpers import ggbatch as cli
from helpers import write_jsonl as write_lines
from test_openai_batch import parse_output

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]


def ggbatch(*args, timeout=240):
    return cli(*args, timeout=timeout)


def chat(cid, text, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], **body}}


def completion(cid, prompt, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": {"prompt": prompt, **body}}


SAMPLED = dict(temperature=1.0, top_p=0.95, max_tokens=8)
BATCH = [
    chat("short", "Once upon a time", max_tokens=4),
    chat("long", "Once upon a time", max_tokens=9),  # the same prompt, another max_tokens: answered apart
    chat("long-again", "Once upon a time", max_completion_tokens=9),  # the same settings: answered once
    completion("raw", "Once upon a time", max_tokens=6),
    completion("raw-stop", "Once upon a time", max_tokens=6, stop=["there"]),
    chat("stream", "The dog", stream=True),
    {"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {"input": "The dog"}},
    chat("odd-field", "The dog", tools=[]),
    chat("seed-5", "The dog ran", seed=5, **SAMPLED),
    chat("seed-5-again", "The dog ran", seed=5, **SAMPLED),
    chat("seed-6", "The dog ran", seed=6, **SAMPLED),
    # an empty object, complete within its 5 tokens (a schema answer cut before it is complete fails)
    chat("schema", "Lily", max_tokens=5, response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "additionalProperties": False}}}),
]
REFUSED = ["stream", "embed", "odd-field"]


def test_an_openai_batch_file_is_answered_line_by_line_and_read_back_by_the_openai_types(tmp_path, demo_model):
    batch, out, report = write_lines(tmp_path / "batch.jsonl", BATCH), tmp_path / "out.jsonl", tmp_path / "r.json"
    # ignore_eos: every answer runs to its own max_tokens; batch-invariant: a sampled answer
    # depends on its seed alone, not on its batch-mates
    r = ggbatch("run", "--model", demo_model, "--input", batch, "--output", out, "--report", report,
                "--ignore-eos", "--batch-invariant")
    assert r.returncode == 1, r.stderr  # some lines failed, the rest are answered
    parsed = parse_output(out.read_text())
    assert list(parsed) == [line["custom_id"] for line in BATCH]  # input order
    bodies = {cid: body for cid, (_, body) in parsed.items() if body is not None}
    assert sorted(set(parsed) - set(bodies)) == sorted(REFUSED)
    assert all(parsed[cid][0].response.status_code == 400 and parsed[cid][0].error.code == "invalid_request"
               for cid in REFUSED)
    assert "body.stream" in parsed["stream"][0].error.message and "/v1/embeddings" in parsed["embed"][0].error.message
    tokens = {cid: b.usage.completion_tokens for cid, b in bodies.items()}
    assert (tokens["short"], tokens["long"], tokens["long-again"], tokens["raw"]) == (4, 9, 9, 6)
    text = {cid: (b.choices[0].text if b.object == "text_completion" else b.choices[0].message.content)
            for cid, b in bodies.items()}
    assert text["long"].startswith(text["short"]) and text["long"] == text["long-again"]
    assert bodies["raw"].object == "text_completion" and bodies["short"].object == "chat.completion"
    assert "there" not in text["raw-stop"] and text["raw"].startswith(text["raw-stop"])
    assert text["seed-5"] == text["seed-5-again"] != text["seed-6"]  # each line's seed, and sampled apart
    assert bodies["short"].usage.prompt_tokens > bodies["raw"].usage.prompt_tokens  # the chat template's words
    assert all(b.usage.total_tokens == b.usage.prompt_tokens + b.usage.completion_tokens for b in bodies.values())
    rep = json.loads(report.read_text())
    q = rep["questions"]
    assert (q["input_format"], q["output_format"], q["records"], q["failed"]) == ("openai", "openai", 12, 3)
    assert q["unique_prompts"] == 11  # long-again shares long's answer; the seeded ones do not merge
    assert rep["generation"]["own_settings"]["response_format.json_schema"] == 1
    assert rep["layout"]["n_ctx_per_sequence"] < 64  # sized for the lines' max_tokens, not the job's 256
    assert r.stderr.count("names model 'gpt-4o-mini'") == 1
    assert "batch.jsonl:6: body.stream" in r.stderr

    # A rerun with one line's max_tokens edited answers that line again; the failed lines go to
    # the errors file, the output keeps the answered ones with their ids.
    edited = copy.deepcopy(BATCH)
    edited[0]["body"]["max_tokens"] = 5
    write_lines(batch, edited)
    errors = tmp_path / "errors.jsonl"
    r = ggbatch("run", "--model", demo_model, "--input", batch, "--output", out, "--report", report,
                "--ignore-eos", "--batch-invariant", "--errors-output", errors)
    assert r.returncode == 1, r.stderr
    again, failed = parse_output(out.read_text()), parse_output(errors.read_text())
    assert list(failed) == REFUSED and list(again) == [cid for cid in parsed if cid not in REFUSED]
    assert again["short"][1].usage.completion_tokens == 5
    assert json.loads(report.read_text())["questions"]["from_journal"] == 8  # all answered but "short"
    assert again["long"][0].id == parsed["long"][0].id and again["short"][0].id != parsed["short"][0].id

    gold = write_lines(tmp_path / "gold.jsonl", [{"questionID": "long", "answer": text["long"]},
                                                 {"questionID": "raw", "answer": "nope"}])
    r = ggbatch("score", "--answers", out, "--gold", gold, "--extract", "exact", "--json", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    overall = json.loads((tmp_path / "s.json").read_text())["overall"]
    assert (overall["n"], overall["correct"]) == (2, 1), overall


def test_duplicate_custom_ids_are_refused_naming_both_lines(tmp_path, demo_model):
    batch = write_lines(tmp_path / "b.jsonl", [chat("a", "x"), chat("b", "y"), chat("a", "z")])
    r = ggbatch("run", "--model", demo_model, "--input", batch, "--output", tmp_path / "o.jsonl")
    assert r.returncode == 2
    assert r.stderr.strip() == f"ggbatch: error: {batch}: duplicate custom_id: 'a' (lines 1 and 3)"
    assert not (tmp_path / "o.jsonl").exists()


def test_chat_lines_are_rendered_with_the_models_chat_template(tmp_path):
    """The demo model has a ChatML template: a line's whole conversation goes through it, a
    completion prompt goes in as it is."""
    from ggbatch.runner.model.make.modelgen import ensure_demo_model
    from ggbatch.runner.questions.prompts import PromptBuilder
    from ggbatch.workers.llama.model_runner import Tokenizer

    turns = [("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"), ("user", "And 3+3?")]
    batch = write_lines(tmp_path / "b.jsonl", [
        {**chat("talk", ""), "body": {"messages": [{"role": r, "content": c} for r, c in turns], "max_tokens": 2}},
        completion("raw", "<|im_start|>user", max_tokens=2)])
    out = tmp_path / "o.jsonl"
    r = ggbatch("run", "--model", "demo", "--input", batch, "--output", out, timeout=280)
    assert r.returncode == 0, r.stderr
    bodies = {cid: body for cid, (_, body) in parse_output(out.read_text()).items()}
    tok = Tokenizer(str(ensure_demo_model()))
    try:
        assert "<|im_start|>" in tok.chat_template
        prompt = PromptBuilder(tok.chat_template, bos_token=tok.bos_text, eos_token=tok.eos_text).render_messages(turns)
        tokens = tok.tokenize(prompt, add_bos=not prompt.startswith(tok.bos_text))
        assert bodies["talk"].usage.prompt_tokens == len(tokens)
        assert bodies["raw"].usage.prompt_tokens == len(tok.tokenize("<|im_start|>user"))
    finally:
        tok.close()


def test_csv_in_and_out_and_scored(tmp_path, demo_model):
    questions = tmp_path / "q.csv"
    with open(questions, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["questionID", "question", "topic", "answer"])
        w.writerow(["q1", "Once upon a time, there was", "animals", "4"])
        w.writerow(["q,2", 'The dog said "hi"\nand ran', "dogs", "5"])
        w.writerow(["q3", "Lily", "people", "6"])
    out = tmp_path / "a.csv"
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", out, "--max-tokens", 6,
                "--template", "{{ question }} ({{ topic }})")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text(), newline="")))
    assert [row["questionID"] for row in rows] == ["q1", "q,2", "q3"]
    assert all(row["answer"] and row["error"] == "" for row in rows) and list(rows[0]) == ["questionID", "answer",
                                                                                            "error"]
    r = ggbatch("score", "--answers", out, "--gold", questions, "--json", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    overall = json.loads((tmp_path / "s.json").read_text())["overall"]
    assert (overall["n"], overall["missing"]) == (3, 0)  # every CSV answer joined to its gold row


def test_integer_ids_are_written_back_as_integers_unless_some_id_is_text(tmp_path, demo_model):
    """A dataset's `{"id": 5}` came back as `{"id": "5"}`, which a caller's lookup by the dataset's
    ids missed. While every id is a JSON integer, JSON and JSON Lines answers write them as such
    (so do the errors file, a rerun from the journal and a merge of shards); one text id among
    them, and every id is written as text, as before."""
    rows = [{"id": 5, "question": "Once upon a time"}, {"id": 12345678901234567890, "question": "Lily"}]
    questions = write_lines(tmp_path / "q.jsonl", rows)
    for name in ("a.jsonl", "a.jsonl", "a.json"):  # the second from the journal
        out = tmp_path / name
        r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", out, "--id-field", "id",
                    "--max-tokens", "2", "-q")
        assert r.returncode == 0, r.stderr
        written = json.loads(out.read_text()) if name.endswith(".json") else parse_lines(out)
        assert [row["id"] for row in written] == [5, 12345678901234567890]
    for i in (0, 1):
        ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "s.jsonl",
                "--id-field", "id", "--max-tokens", "2", "-q", "--shard", f"{i}/2")
    parts = sorted(tmp_path.glob("s.shard-*-of-2.jsonl"))
    r = ggbatch("merge", "--output", tmp_path / "m.jsonl", "--input", questions, "--id-field", "id", *parts)
    assert r.returncode == 0, r.stderr
    assert [row["id"] for row in parse_lines(tmp_path / "m.jsonl")] == [5, 12345678901234567890]
    for part in parts:  # a question no part holds is said with its id as the others are written
        r = ggbatch("merge", "--output", tmp_path / "m.jsonl", "--input", questions, "--id-field", "id", part)
        ids = [row["id"] for row in parse_lines(tmp_path / "m.jsonl")]
        assert r.returncode == 1 and ids == [5, 12345678901234567890], r.stderr
    long = write_lines(tmp_path / "long.jsonl", [*rows, {"id": 9, "question": "The dog ran " * 40}])
    r = ggbatch("run", "--model", demo_model, "--input", long, "--output", tmp_path / "c.jsonl", "--id-field", "id",
                "--max-tokens", "2", "--n-ctx", "32", "--errors-output", tmp_path / "e.jsonl", "-q")
    assert r.returncode == 1 and [row["id"] for row in parse_lines(tmp_path / "e.jsonl")] == [9]
    mixed = write_lines(tmp_path / "mixed.jsonl", [*rows, {"id": "x", "question": "The dog"}])
    r = ggbatch("run", "--model", demo_model, "--input", mixed, "--output", tmp_path / "b.jsonl", "--id-field", "id",
                "--max-tokens", "2", "-q")
    assert [row["id"] for row in parse_lines(tmp_path / "b.jsonl")] == ["5", "12345678901234567890", "x"]
    for i in (0, 1):  # shard 0 holds the integers alone, and writes them as the whole file's run does
        ggbatch("run", "--model", demo_model, "--input", mixed, "--output", tmp_path / "t.jsonl",
                "--id-field", "id", "--max-tokens", "2", "-q", "--shard", f"{i}/2")
    assert [[row["id"] for row in parse_lines(tmp_path / f"t.shard-{i}-of-2.jsonl")] for i in (0, 1)] == [
        ["5", "12345678901234567890"], ["x"]]


def parse_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]
