"""Numbers a user can trust (issue 29): `ggbatch score`'s counts and numbers, the run's counts in
the report and the summary (one definition each: records), prompt tokens only when decoded, and
`ggbatch merge` refusing shards of different jobs. Real files, real processes, real tiny models."""

import json

import pytest

from helpers import ggbatch as cli
from helpers import write_jsonl


def ggbatch(*args, timeout=200):
    return cli(*args, timeout=timeout)


# -- ggbatch score ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_score_counts_answers_to_records_without_gold_apart_from_unknown_ids(tmp_path):
    gold = write_jsonl(tmp_path / "g.jsonl", [
        {"questionID": "a", "question": "?", "answer": "1"},
        {"questionID": "b", "question": "?"},  # no gold answer
        {"questionID": "c", "question": "?", "answer": None},
        {"questionID": "d", "question": "?", "answer": ""}])  # empty: skipped like null, not scored as wrong
    answers = write_jsonl(tmp_path / "a.jsonl", [{"questionID": q, "answer": "1"} for q in ("a", "b", "c", "d", "z")])
    out = tmp_path / "s.json"
    r = ggbatch("score", "--answers", answers, "--gold", gold, "--json", out, timeout=60)
    assert r.returncode == 0, r.stderr
    summary = json.loads(out.read_text())
    assert summary["overall"]["n"] == 1 and summary["overall"]["correct"] == 1
    assert (summary["answers_not_in_gold"], summary["gold_without_answer"],
            summary["answers_without_gold_answer"]) == (1, 3, 3)
    assert "answers whose id is not in the gold file: 1 (not scored)" in r.stdout
    assert "gold records without a gold answer: 3, 3 of them answered (not scored)" in r.stdout


@pytest.mark.timeout(60)
def test_score_reads_a_number_without_its_leading_zero(tmp_path):
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "half", "question": "?", "answer": "0.5"},
                                              {"questionID": "fifty", "question": "?", "answer": "50"},
                                              {"questionID": "cents", "question": "?", "answer": "0.50"}])
    answers = write_jsonl(tmp_path / "a.jsonl", [{"questionID": "half", "answer": "It is .5"},
                                                 {"questionID": "fifty", "answer": "It costs $.50"},
                                                 {"questionID": "cents", "answer": "#### $.50"}])
    details = tmp_path / "d.jsonl"
    r = ggbatch("score", "--answers", answers, "--gold", gold, "--details", details, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in map(json.loads, details.read_text().splitlines())}
    assert (rows["half"]["extracted"], rows["half"]["status"]) == (".5", "correct")
    assert (rows["fifty"]["extracted"], rows["fifty"]["status"]) == (".50", "wrong")
    assert rows["cents"]["status"] == "correct"


# -- the run's numbers --------------------------------------------------------------------------

# One worker of one thread: on a busy 2-core machine more threads wait at llama.cpp's barriers.
FLAGS = ("--workers", 1, "--threads", 1, "--progress", "off")


def run(model, questions, output, *args):
    return ggbatch("run", "--model", model, "--input", questions, "--output", output, *FLAGS, *args)


@pytest.mark.model
@pytest.mark.timeout(240)
def test_prompt_tokens_count_only_prompts_decoded_and_refused_ones_apart(tmp_path, demo_model):
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": "short", "question": "Once upon a time"},
                                                   {"questionID": "long", "question": "word " * 300}])
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    r = run(demo_model, questions, out, "--n-ctx", 64, "--max-tokens", 4, "--report", report)
    assert r.returncode == 1, r.stderr
    rows = {row["questionID"]: row for row in json.loads(out.read_text())}
    refused = int(rows["long"]["error"].split("prompt has ")[1].split()[0])
    assert refused > 64
    tokens = json.loads(report.read_text())["tokens"]
    # Only the short question went through the model: its prompt fits the context of 64.
    assert 0 < tokens["prompt"] < 64 and tokens["prompt_refused"] == refused
    run_s = json.loads(report.read_text())["timings_s"]["run_s"]
    assert tokens["prompt_per_s"] <= 64 / run_s
    assert json.loads(report.read_text())["prefix_cache"]["prompt_tokens"] == tokens["prompt"]
    assert f", {refused} prompt tokens refused (not decoded)" in r.stdout


@pytest.mark.model
@pytest.mark.timeout(240)
def test_the_report_counts_the_prompt_tokens_in_the_questions_and_those_computed_apart(tmp_path, demo_model):
    """A shared system prompt is computed once per worker, not once per question: the summary's
    prompt rate was that of every question's whole prompt, 2-3 times the progress line's and the
    timeline's, next to a doc saying "decoded"."""
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": f"q{i}", "question": f"Story {i}"}
                                                   for i in range(12)])
    report = tmp_path / "r.json"
    r = run(demo_model, questions, tmp_path / "a.json", "--max-tokens", 2, "--report", report,
            "--system", "You are a careful teller of short stories for small children, " * 3)
    assert r.returncode == 0, r.stderr
    rep = json.loads(report.read_text())
    tokens, cache = rep["tokens"], rep["prefix_cache"]
    assert rep["layout"]["shared_prefix_tokens"] > 20
    assert tokens["prompt"] == cache["prompt_tokens"] and tokens["prompt_computed"] == cache["prompt_tokens_computed"]
    assert tokens["prompt_computed"] == rep["timeline"][-1]["prompt_tokens"]
    assert 0 < tokens["prompt_computed"] < tokens["prompt"] - 10 * rep["layout"]["shared_prefix_tokens"]
    run_s = rep["timings_s"]["run_s"]
    assert tokens["prompt_computed_per_s"] == pytest.approx(tokens["prompt_computed"] / run_s, rel=0.02)
    assert (f"{tokens['prompt']} prompt in the questions answered ({tokens['prompt_per_s']:.1f}/s), "
            f"{tokens['prompt_computed']} prompt computed ({tokens['prompt_computed_per_s']:.1f}/s)") in r.stdout


@pytest.mark.parametrize("n, p50, p95", [(1, 1, 1), (2, 1, 2), (6, 3, 6), (20, 10, 19), (60, 30, 57), (101, 51, 96)])
def test_latency_percentiles_are_nearest_rank(n, p50, p95):
    """The ceil(q*n)-th smallest: p50 of 2 was 2.0, p95 of 20 the max (round() took half-ranks to even)."""
    from ggbatch.runner.report.report import percentiles

    assert percentiles([float(i) for i in range(n, 0, -1)]) == {"p50": p50, "p95": p95, "max": n}


@pytest.mark.model
@pytest.mark.timeout(240)
def test_latency_is_null_not_zero_when_no_answer_was_timed(tmp_path, demo_model):
    """An all-failed run, and a rerun served from the journal, said `latency p50 0.00 s`."""
    failing = write_jsonl(tmp_path / "f.jsonl", [{"questionID": "long", "question": "word " * 300}])
    report = tmp_path / "r.json"
    r = run(demo_model, failing, tmp_path / "f.json", "--n-ctx", 64, "--report", report)
    assert r.returncode == 1, r.stderr
    rep = json.loads(report.read_text())
    nothing = {"p50": None, "p95": None, "max": None}
    assert rep["latency_s"] == rep["ttft_s"] == nothing
    assert "latency    n/a (no answer of this run was timed" in r.stdout and "0.00 s, p95" not in r.stdout
    good = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "a", "question": "Once upon a time"}])
    out = tmp_path / "g.json"
    first = run(demo_model, good, out, "--max-tokens", 4, "--report", report)
    assert first.returncode == 0 and json.loads(report.read_text())["latency_s"]["max"] > 0, first.stderr
    again = run(demo_model, good, out, "--max-tokens", 4, "--report", report)
    assert again.returncode == 0, again.stderr
    assert json.loads(report.read_text())["latency_s"] == nothing and "latency    n/a" in again.stdout


@pytest.mark.model
@pytest.mark.timeout(240)
def test_the_reports_errors_name_every_failed_record_duplicates_included(tmp_path, demo_model):
    """Two records of one prompt too long for the context: `failed` said 2, `errors` named one."""
    long = "word " * 300
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": "ok", "question": "Once upon a time"},
                                                   {"questionID": "long-1", "question": long},
                                                   {"questionID": "long-2", "question": long}])
    report = tmp_path / "r.json"
    r = run(demo_model, questions, tmp_path / "a.json", "--n-ctx", 64, "--max-tokens", 4, "--report", report)
    assert r.returncode == 1, r.stderr
    rep = json.loads(report.read_text())
    assert rep["questions"]["failed"] == 2
    assert [e["questionID"] for e in rep["errors"]] == ["long-1", "long-2"]
    assert rep["errors"][0]["error"] == rep["errors"][1]["error"] and "prompt has" in rep["errors"][0]["error"]


@pytest.mark.model
@pytest.mark.timeout(240)
def test_untokenizable_duplicates_are_counted_by_record_and_as_one_prompt(tmp_path):
    from conftest import MODELS, require

    model = require(MODELS / "TinyStories-656K-Q8_0.gguf",
                    "TinyStories' tokenizer, which lacks characters (and aborts on them without ggbatch's check)")
    texts = {"a": "Once upon a time.", "b": "It’s a dog.", "c": "It’s a dog.", "d": "Once upon a time."}
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": k, "question": v} for k, v in texts.items()])
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    r = run(str(model), questions, out, "--max-tokens", 4, "--report", report)
    assert r.returncode == 1, r.stderr
    q = json.loads(report.read_text())["questions"]
    assert (q["records"], q["unique_prompts"]) == (4, 2)  # "Once upon a time." and "It’s a dog."
    assert (q["answered"], q["failed"], q["not_answered"], q["from_journal"]) == (2, 2, 0, 0)
    assert sum(q["finish_reasons"].values()) == 4 and q["finish_reasons"]["error"] == 2
    assert "answered   2/4 records, 2 failed (2 unique prompts)" in r.stdout
    # rows, not answers: the two failed rows hold none (it said "wrote 4 answers")
    assert f"wrote 4 rows to {out} (2 answered, 2 failed), report to {report}" in r.stdout
    out2, errors = tmp_path / "b.json", tmp_path / "errors.json"
    r = run(str(model), questions, out2, "--max-tokens", 4, "--errors-output", errors)
    assert r.returncode == 1, r.stderr
    assert f"wrote 2 answers to {out2}, 2 rows without one to {errors}" in r.stdout
    assert (len(json.loads(out2.read_text())), len(json.loads(errors.read_text()))) == (2, 2)


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_resumed_runs_report_counts_every_record_as_a_whole_run_does(tmp_path, demo_model):
    first = [{"questionID": "q0", "question": "Once upon a time"}, {"questionID": "q1", "question": "The dog ran"}]
    more = [{"questionID": "q2", "question": "Once upon a time"}, {"questionID": "q3", "question": "A big red ball"}]
    questions, out, report = tmp_path / "q.jsonl", tmp_path / "a.json", tmp_path / "r.json"
    write_jsonl(questions, first)
    assert run(demo_model, questions, out, "--max-tokens", 6).returncode == 0
    write_jsonl(questions, first + more)  # two more lines, one a duplicate of an answered one
    r = run(demo_model, questions, out, "--max-tokens", 6, "--report", report)
    assert r.returncode == 0, r.stderr
    resumed = json.loads(report.read_text())["questions"]
    whole_report = tmp_path / "whole.json"
    assert run(demo_model, questions, tmp_path / "whole-a.json", "--max-tokens", 6,
               "--report", whole_report).returncode == 0
    whole = json.loads(whole_report.read_text())["questions"]
    # q0, q1 and q2 (q0's prompt) took their answers from the journal: 3 records, 1 made now.
    assert resumed["from_journal"] == 3 and whole["from_journal"] == 0
    assert {**resumed, "from_journal": 0} == whole
    assert (whole["records"], whole["unique_prompts"], whole["answered"], whole["failed"]) == (4, 3, 4, 0)
    assert sum(whole["finish_reasons"].values()) == 4
    assert "answered   4/4 records, 3 from the journal (3 unique prompts)" in r.stdout


# -- ggbatch merge ------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.timeout(300)
def test_merge_refuses_shards_of_two_jobs_naming_the_parts_and_the_setting(tmp_path, demo_model, questions_file):
    questions, output = questions_file(6), str(tmp_path / "answers.jsonl")
    for shard, max_tokens in (("0/2", 4), ("1/2", 6)):  # the second shard run with another max_tokens
        r = run(demo_model, questions, output, "--shard", shard, "--max-tokens", max_tokens)
        assert r.returncode == 0, r.stderr
    parts = [str(tmp_path / f"answers.shard-{i}-of-2.jsonl") for i in range(2)]
    merged = tmp_path / "merged.jsonl"
    r = ggbatch("merge", "--input", questions, "--output", merged, *parts)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"ggbatch: error: parts of two jobs: {parts[0]} and {parts[1]} were answered "
                                     "with different 'max_tokens' (4 and 6, as their journals say); merge the "
                                     "shards of one job"]
    assert not merged.exists()

    r = run(demo_model, questions, output, "--shard", "1/2", "--max-tokens", 4, "--fresh")  # the same job now
    assert r.returncode == 0, r.stderr
    r = ggbatch("merge", "--input", questions, "--output", merged, *parts)
    assert r.returncode == 0, r.stderr

