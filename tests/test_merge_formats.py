"""`ggbatch merge` across formats: a merged file in JSON, JSON Lines or CSV is the file a run
writing that format writes for the same answers, whatever the parts' formats: the same columns,
the same cells (lists and objects as JSON text in CSV, a `samples` count), the same JSON types
(a list of samples, token log-probabilities and choice log-probabilities as JSON, never as their
CSV text). First on rows the run's own writer renders (every field an answer can carry, no model),
then on real sharded runs of the demo model: n samples with token log-probabilities, and choices
with their log-probabilities."""

import csv
import io
import json

import pytest

from ggbatch.runner.errors import InputError
from ggbatch.runner.files.outputs import OutputSpec, Row, render
from ggbatch.runner.files.shards import shard_of
from ggbatch.runner.merge.command import merge_files
from ggbatch.runner.scoring.files import read_answers
from ggbatch.workers.protocol import FinishReason, Sample, TokenLogprob
from helpers import answer as make_answer
from helpers import ggbatch as cli
from helpers import write_jsonl

FORMATS = ("json", "jsonl", "csv")
PAIRS = [(source, target) for source in FORMATS for target in FORMATS]


def tokens(*pieces):
    return tuple(TokenLogprob(i, p.encode(), -0.25 * (i + 1), ((i, p.encode(), -0.25 * (i + 1)), (9, b" x", -3.5)))
                 for i, p in enumerate(pieces))


def sample(text, *pieces):
    return Sample(text, FinishReason.STOP, len(pieces), tokens(*pieces) if pieces else None)


# Every field a run writes, and texts that look like the JSON text CSV holds ggbatch's fields in
SAMPLED = {
    "s1": [sample("<think>hm</think> 12", "1", "2"), sample('["not", "a list"]', "[")],
    "s2": [sample('say "hi",\nthen', "say"), sample("", "")],
}
SINGLE = {
    "c1": dict(text="B", choice_logprobs={"A": -1.5, "B": -0.25}, token_logprobs=tokens("B")),
    "c2": dict(text='{"A": 1}', answer_norm="A", choice_logprobs={"A": -0.5, "B": -2.0}),
    "c3": dict(text="[1, 2]", token_logprobs=tokens("[", "1")),
    "c4": dict(text="<think>why</think>plain"),
}
FAILED = "f1"


def rows(ids):
    out = []
    for qid in ids:
        if qid == FAILED:
            out.append(Row(qid, None, "the prompt is longer than the context"))
        elif qid in SAMPLED:
            first = SAMPLED[qid][0]
            out.append(Row(qid, make_answer(qid, first.text, samples=tuple(SAMPLED[qid]),
                                            token_logprobs=first.token_logprobs)))
        else:
            out.append(Row(qid, make_answer(qid, **SINGLE[qid])))
    return out


def job_spec(fmt, ids):
    has = {key for qid in ids for key, value in SINGLE.get(qid, {}).items() if value is not None}
    return OutputSpec(fmt, keep_thinking=True, choice_logprobs="choice_logprobs" in has,
                      token_logprobs=any(q in SAMPLED for q in ids) or "token_logprobs" in has,
                      answer_norm="answer_norm" in has, samples=any(q in SAMPLED for q in ids))


JOBS = {"samples": ["s1", FAILED, "s2"], "choices": ["c1", "c2", FAILED, "c3", "c4"]}


def written(tmp_path, ids, spec, name):
    """A shard's file as a run of the whole job writes it (the job's spec: its columns)."""
    path = tmp_path / f"{name}.{spec.format}"
    path.write_text(render(rows(ids), spec), newline="")
    return str(path)


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("source,target", PAIRS)
def test_rows_of_every_kind_merge_into_what_a_run_writes_in_each_format(tmp_path, job, source, target):
    ids = JOBS[job]
    questions = str(write_jsonl(tmp_path / "questions.jsonl", [{"questionID": q, "question": "?"} for q in ids]))
    parts = [written(tmp_path, [q for q in ids if shard_of(q, 2) == i], job_spec(source, ids), f"a.shard-{i}-of-2")
             for i in range(2)]
    out = tmp_path / f"merged.{target}"
    merge_files(str(out), parts, questions)
    assert out.read_bytes() == render(rows(ids), job_spec(target, ids)).encode()


def test_a_csv_cell_ggbatch_does_not_write_as_json_stays_text(tmp_path):
    part = tmp_path / "part.csv"
    part.write_text('questionID,answer,error,note\r\nq1,"[""a""]",,"{""k"": 1}"\r\nq2,"{}",,\r\n', newline="")
    out = tmp_path / "merged.jsonl"
    merge_files(str(out), [str(part)])
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"questionID": "q1", "answer": '["a"]', "note": '{"k": 1}'},
        {"questionID": "q2", "answer": "{}", "note": ""}]


def test_a_column_the_job_asked_for_is_written_where_no_row_has_its_field(tmp_path):
    """Choices that take the grammar path have no choice_logprobs; a run asked for them still
    writes the column, and so does a merge, from the settings in the parts' journals."""
    spec = OutputSpec("csv", choice_logprobs=True, token_logprobs=True)
    whole = render(rows(["c4"]), spec)
    part = tmp_path / "part.json"
    part.write_text(render(rows(["c4"]), OutputSpec("json")))
    settings = {"answer": {"choices": [], "grammar": None, "logprobs": True, "choice_logits": True},
                "answer.token_logprobs": 0, "shard": "0/1"}
    header = {"ggbatch_journal": 1, "fingerprint": settings}
    (tmp_path / "part.json.journal.jsonl").write_text(json.dumps(header) + "\n")
    merge_files(str(tmp_path / "merged.csv"), [str(part)])
    assert (tmp_path / "merged.csv").read_bytes() == whole.encode()
    assert whole.startswith("questionID,answer,error,choice_logprobs,token_logprobs\r\n")


def test_a_samples_cell_that_is_not_json_is_named(tmp_path):
    part = tmp_path / "part.csv"
    part.write_text("questionID,answer,error,samples\r\nq1,two,,2\r\n", newline="")
    with pytest.raises(InputError, match=r"part.csv:2: column 'answer' .*'two'"):
        merge_files(str(tmp_path / "merged.json"), [str(part)])


# -- real sharded runs ------------------------------------------------------------------------------

# --batch-invariant: a shard's answers are the unsharded run's, so merged files compare byte for byte
FLAGS = ("--max-tokens", 5, "--batch-invariant", "--workers", 1, "--threads", 1, "--progress", "off")
RUNS = {
    "samples": ("--n", 3, "--temperature", 0.8, "--seed", 7, "--token-logprobs", 2),
    "choices": ("--choices", "auto", "--choice-logprobs", "--token-logprobs", 2),
}


def questions(tmp_path, job):
    records = [{"questionID": f"q{i}", "question": f"Is {i} more than {i + 1}?"} for i in range(4)]
    if job == "choices":  # one token each (answered from the logits, with choice_logprobs), or not
        for i, rec in enumerate(records):
            rec["choices"] = [["A", "B", "C"], ["yes", "no", "maybe"]][i % 2]
    return str(write_jsonl(tmp_path / "questions.jsonl", records))


def run(model, questions, output, *args):
    r = cli("run", "--model", model, "--input", questions, "--output", output, *FLAGS, *args)
    assert r.returncode == 0, r.stderr


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("job", sorted(RUNS))
def test_sharded_runs_merge_into_the_unsharded_run_of_every_format(tmp_path, demo_model, job):
    q = questions(tmp_path, job)
    whole, parts = {}, {}
    for fmt in FORMATS:
        whole[fmt] = tmp_path / f"whole.{fmt}"
        run(demo_model, q, whole[fmt], *RUNS[job])
        for i in range(2):
            run(demo_model, q, tmp_path / f"answers.{fmt}", "--shard", f"{i}/2", *RUNS[job])
        parts[fmt] = [str(tmp_path / f"answers.shard-{i}-of-2.{fmt}") for i in range(2)]
    assert {shard_of(f"q{i}", 2) for i in range(4)} == {0, 1}  # both shards hold questions
    for source in FORMATS:
        for target in FORMATS:
            out = tmp_path / f"merged-{source}.{target}"
            r = cli("merge", "--input", q, "--output", out, *parts[source])
            assert r.returncode == 0, r.stderr
            assert out.read_bytes() == whole[target].read_bytes(), (source, target)
    text = whole["jsonl"].read_text(encoding="utf-8")
    kinds = {k for line in text.splitlines() for k in json.loads(line)}
    assert kinds == {"questionID", "answer", "token_logprobs"} | ({"choice_logprobs"} if job == "choices" else set())
    if job == "samples":  # score reads the merged CSV's samples as lists, as it reads the run's
        merged, _ = read_answers(str(tmp_path / "merged-jsonl.csv"))
        assert all(isinstance(a, list) and len(a) == 3 for a in merged.values())
        header = next(csv.reader(io.StringIO(whole["csv"].read_text(encoding="utf-8"))))
        assert header[-1] == "samples"


def without_times(line):
    """An OpenAI Batch output line less what says when it was answered (ids and created)."""
    obj = json.loads(line)
    del obj["id"], obj["response"]["request_id"], obj["response"]["body"]["id"], obj["response"]["body"]["created"]
    return obj


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_openai_batch_output_parts_keep_their_samples_and_logprobs(tmp_path, demo_model):
    """OpenAI Batch output is merged line by line: n choices and their token log-probabilities
    stay as the shard wrote them; converting it to another format is refused (exit 2)."""
    batch = tmp_path / "batch.jsonl"
    write_jsonl(batch, [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": f"Count to {i}"}], "n": 2,
                                  "temperature": 0.8, "seed": i, "logprobs": True, "top_logprobs": 2}}
                        for i in range(4)])
    run(demo_model, batch, tmp_path / "whole.jsonl")
    for i in range(2):
        run(demo_model, batch, tmp_path / "out.jsonl", "--shard", f"{i}/2")
    parts = [str(tmp_path / f"out.shard-{i}-of-2.jsonl") for i in range(2)]
    merged = tmp_path / "merged.jsonl"
    r = cli("merge", "--input", batch, "--output", merged, *parts)
    assert r.returncode == 0, r.stderr
    lines = [without_times(line) for line in merged.read_text(encoding="utf-8").splitlines()]
    assert lines == [without_times(line) for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
    choices = [c for line in lines for c in line["response"]["body"]["choices"]]
    assert len(choices) == 8 and all(len(c["logprobs"]["content"][0]["top_logprobs"]) == 2 for c in choices)
    r = cli("merge", "--input", batch, "--output", tmp_path / "merged.csv", *parts)
    assert r.returncode == 2 and "does not convert to csv" in r.stderr
