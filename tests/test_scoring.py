"""Scoring: extraction rules (pure), the answer and gold readers, and `ggbatch score` itself."""

import json
import math
import re

import pytest

from conftest import DATA, require
from ggbatch.runner.cli import build_parser
from ggbatch.runner.errors import InputError
from ggbatch.runner.files.formats.openai_output import batch_line
from ggbatch.runner.files.formats.rows import OutputSpec, Row, not_answered, row_fields
from ggbatch.runner.scoring.command import cmd_score
from ggbatch.runner.scoring.files import openai_text, read_answers, read_gold
from ggbatch.runner.scoring.rules import (
    Gold,
    accuracy_stderr,
    auto_rule,
    extract_letter,
    extract_number,
    group_of,
    normalise_text,
    parse_number,
    score_one,
    tally,
)
from ggbatch.runner.scoring.table import ScoreResult, format_table, score
from ggbatch.workers.protocol import Answer, FinishReason
from helpers import ggbatch, write_jsonl
from test_score_cli import score_cli

MMLU = DATA / "mmlu" / "questions.jsonl"
GSM8K_RAW = DATA / "gsm8k" / "raw" / "grade_school_math" / "data" / "test.jsonl"


# -- numbers (GSM8K) ----------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", "18"),
    ("#### 1,000 and then 7", "1000"),  # strict match wins over the last number
    ("The answer is $18.00.", "18.00"),
    ("18 dollars", "18"),
    ("She loses -3 eggs", "-3"),
    ("1,234,567 people", "1234567"),
    ("the numbers 1,2,3", "3"),  # a list, not thousands
    ("It is 7.", "7"),  # a full stop is not a decimal point
    ("Answer: 12\nQuestion: 5 apples", "5"),  # the last number, as the harness's flexible filter
    ("The answer is \u22125", "-5"),  # a typeset minus sign (U+2212) is a minus, not dropped
    ("#### \u22127", "-7"),
])
def test_number_extraction(text, expected):
    assert extract_number(text) == expected


@pytest.mark.parametrize("text", ["no idea", "", "####", "#### ... and nothing"])
def test_nothing_numeric_is_invalid(text):
    assert extract_number(text) is None
    assert score_one(Gold("q", "18"), text, "number", "all").status == "invalid"


@pytest.mark.parametrize("answer, correct", [
    ("The answer is $18.00.", True), ("18 dollars", True), ("18.0", True), ("#### 18", True),
    ("#### 17", False), ("I think 19", False),
])
def test_numbers_compare_as_numbers(answer, correct):
    assert score_one(Gold("q", "18"), answer, "number", "all").correct is correct


def test_gold_with_thousands_separator():
    assert parse_number("2,125") == parse_number("2125.0")
    assert score_one(Gold("q", "2,125"), "They paid $2,125 in total.", "auto", "all").correct


def test_every_real_gsm8k_reference_solution_scores_right():
    """The 1,319 reference solutions of GSM8K end in `#### N`: the strict rule finds every gold
    answer in them; without the `####` line the last number still finds nearly all."""
    raw = require(GSM8K_RAW, "GSM8K's 1,319 real reference solutions")
    solutions = [json.loads(line)["answer"] for line in raw.read_text().splitlines()]
    gold = [Gold(str(i), s.split("####")[-1].strip()) for i, s in enumerate(solutions)]
    strict = [score_one(g, s, "auto", "all") for g, s in zip(gold, solutions)]
    assert tally(strict).correct == 1319 and {s.rule for s in strict} == {"number"}
    flexible = tally(score_one(g, s.split("####")[0], "number", "all") for g, s in zip(gold, solutions))
    assert flexible.invalid == 0 and flexible.correct / flexible.n > 0.95


# -- letters (multiple choice) ------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("B", "B"), ("(B)", "B"), ("B.", "B"), ("**B**", "B"), ("b", "B"),
    ("The answer is B", "B"), ("The correct answer is (C).", "C"), ("Answer: D", "D"),
    ("b) because the group is cyclic", "B"), ("B. 8", "B"), ("  (d) six", "D"),
    ("Let me think.\nThe cyclic group has order 4, so the answer is A.", "A"),
    ("B\nThe answer is C", "B"),  # the first line decides
    ("The answer is (b)", "B"), ("so the answer is [c].", "C"),  # a small letter, in brackets
    ("Option B is correct.", "B"), ("I would pick choice (c) here", "C"), ("The best option: D", "D"),
    ("The correct option is C", "C"),
    ("Option A is wrong, so the answer is B.", "B"),  # an "answer is" first, wherever it is
])
def test_letter_extraction(text, expected):
    assert extract_letter(text, "ABCD") == expected


@pytest.mark.parametrize("text", [
    "A little girl went to the park.",  # an article, not a choice
    "I think so.",
    "The capital is Paris.\nB",  # a letter on a later line only: first line only
    "the answer is a dog",
    "the answer is a bit unclear",  # a small letter out of brackets is a word
    "Another option is a guess.", "the first choice I made",
    "E",  # not one of this question's choices
    "",
])
def test_no_letter(text):
    assert extract_letter(text, "ABCD") is None


def test_letter_by_choice_text():
    choices = {"A": "4", "B": "8", "C": "12", "D": "6"}
    assert extract_letter("8", "ABCD", choices) == "B"
    assert extract_letter("12.", "ABCD", choices) == "C"
    # equal texts (real MMLU rows have them): the first, as a tie's pick is
    assert extract_letter("12", "ABCD", {"A": "12", "B": "-4", "C": "4", "D": "12"}) == "A"


def test_auto_rule_follows_the_gold():
    assert auto_rule(Gold("q", "B")) == "letter"
    assert auto_rule(Gold("q", "4", {"A": "4", "B": "5"})) == "letter"
    assert auto_rule(Gold("q", "70000")) == "number"
    assert auto_rule(Gold("q", "The watermelon seeds pass through")) == "exact"


def test_exact_is_normalised():
    assert normalise_text("  The Seeds pass  through.\n") == "the seeds pass through"
    assert score_one(Gold("q", "Paris"), " paris! ", "exact", "all").correct
    assert not score_one(Gold("q", "Paris"), "Paris, France", "exact", "all").correct
    assert score_one(Gold("q", "Paris"), "   ", "exact", "all").status == "invalid"


def test_regex_rule_takes_the_first_group():
    pattern = re.compile(r"Final: (\S+)")
    assert score_one(Gold("q", "42"), "work... Final: 42.0", "regex", "all", pattern).correct
    assert score_one(Gold("q", "yes"), "Final: YES", "regex", "all", pattern).correct
    assert score_one(Gold("q", "yes"), "no marker", "regex", "all", pattern).status == "invalid"


# -- accuracy, standard error, groups -----------------------------------------------------------


def test_stderr_is_the_harness_sample_standard_error():
    # 7 of 10: the sample standard deviation of seven 1s and three 0s over sqrt(10)
    scores = [1] * 7 + [0] * 3
    mean = sum(scores) / 10
    sample_sd = math.sqrt(sum((x - mean) ** 2 for x in scores) / 9)
    assert accuracy_stderr(7, 10) == pytest.approx(sample_sd / math.sqrt(10))
    assert accuracy_stderr(7, 10) == pytest.approx(math.sqrt(0.7 * 0.3 / 9)) == pytest.approx(0.1527525, abs=1e-7)
    assert accuracy_stderr(0, 5) == 0 and accuracy_stderr(1, 1) is None


def test_groups_from_mmlu_ids():
    by = re.compile(r"mmlu-(.*)-\d+")
    assert group_of("mmlu-abstract_algebra-11", by) == "abstract_algebra"
    assert group_of("mmlu-high_school_us_history-3", by) == "high_school_us_history"
    assert group_of("gsm8k-1", by) == "(other)"
    assert group_of("anything", None) == "all"


def test_missing_and_unknown_answers():
    gold = [Gold("a", "1"), Gold("b", "2"), Gold("c", "3")]
    scored, unknown, without_gold = score(gold, {"a": "1", "c": None, "zz": "9"}, "auto")
    assert [s.status for s in scored] == ["correct", "missing", "missing"] and (unknown, without_gold) == (1, 0)
    t = tally(scored)
    assert (t.n, t.correct, t.missing) == (3, 1, 2) and t.accuracy == pytest.approx(1 / 3)


# -- files --------------------------------------------------------------------------------------


def test_openai_batch_output(tmp_path):
    def line(cid, content=None, text=None, error=None, status=200):
        choice = {"index": 0, "message": {"role": "assistant", "content": content}} if text is None else {"text": text}
        return {"id": f"batch_req_{cid}", "custom_id": cid, "error": error,
                "response": None if error else {"status_code": status, "request_id": "r",
                                                "body": {"object": "chat.completion", "choices": [choice]}}}
    path = write_jsonl(tmp_path / "batch_output.jsonl", [
        line("q1", content="The answer is B"), line("q2", text=" C"), line("q3", error={"code": "x", "message": "y"}),
        line("q4", content="A", status=500)])
    assert read_answers(path) == ({"q1": "The answer is B", "q2": " C", "q3": None, "q4": None}, set())
    assert openai_text({"custom_id": "r", "response": {"status_code": 200, "body": {"output": [
        {"type": "message", "content": [{"type": "output_text", "text": "D"}]}]}}}) == "D"


def test_csv_and_json_array_answers(tmp_path):
    csv_path = tmp_path / "submission.csv"
    csv_path.write_text('id,answer\nq1,"B, because\nit is"\nq2,\n7,18\n')
    assert read_answers(str(csv_path), id_field="id") == ({"q1": "B, because\nit is", "q2": "", "7": "18"}, set())
    array = tmp_path / "answers.json"
    array.write_text(json.dumps([{"questionID": "q1", "answer": "A"},
                                 {"questionID": "q2", "answer": None, "error": "not answered: x"}]))
    assert read_answers(str(array)) == ({"q1": "A", "q2": None}, {"q2"})


@pytest.mark.parametrize("content, message", [
    ('{"questionID": "a", "answer": "1"}\n{"questionID": "a", "answer": "2"}\n',
     "duplicate answer for 'a' (lines 1 and 2)"),
    ('{"questionID": "a", "answer": "1"}\n{"questionID": "b", "answer": \n', ":2: malformed JSON"),
    ('{"id": "a", "answer": "1"}\n', ":1: no 'questionID' field (it has: id, answer)"),
    ('{"questionID": "a", "answer": {"x": 1}}\n', ":1: 'answer' must be a string or a number"),
    ('{"questionID": "a", "answer": ["x", 1]}\n', ":1: 'answer' must be a text or a list of sample texts"),
])
def test_unreadable_answers_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "a.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=re.escape(message)):
        read_answers(str(path))


def test_a_json_answers_or_gold_file_holding_json_lines_is_named_for_what_it_is(tmp_path):
    """score --answers x.json holding JSON Lines said 'a .json question file must hold a JSON array'."""
    path = tmp_path / "x.json"
    path.write_text('{"questionID": "a", "answer": "1"}\n')
    with pytest.raises(InputError, match=re.escape(f"{path}: a .json answers file must hold a JSON array")):
        read_answers(str(path))
    with pytest.raises(InputError, match=re.escape(f"{path}: a .json gold file must hold a JSON array")):
        read_gold(str(path))


def test_gold_with_choices_list_and_records_without_gold(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [
        {"questionID": "1", "question": "?", "answer": "B", "choices": ["x", "y"]},
        {"questionID": "2", "question": "?"},
        {"questionID": 3, "question": "?", "answer": 18}])
    gold, without = read_gold(path)
    assert gold == [Gold("1", "B", {"A": "x", "B": "y"}), Gold("3", "18")] and without == {"2"}


# -- the command --------------------------------------------------------------------------------


def score_main(*argv):
    """`ggbatch score` in this process, parsed by the real parser (cli.main would also reset the
    ggbatch logger, which other tests' log captures rely on)."""
    return cmd_score(build_parser().parse_args(["score", *map(str, argv)]))


def mmlu_answers(tmp_path, n=40):
    """The first n MMLU questions (gold) and answers with a known score: every 4th answered right in
    four spellings, every 4th wrong, every 4th nonsense (invalid), every 4th absent (missing);
    plus one answer whose id is not in the gold file."""
    records = [json.loads(line) for line in require(MMLU, "MMLU's real records").read_text().splitlines()[:n]]
    gold = write_jsonl(tmp_path / "gold.jsonl", records)
    spellings = ["{}", "({})", "The answer is {}.", "{}. because"]
    rows = []
    for i, r in enumerate(records):
        wrong = "ABCD"[("ABCD".index(r["answer"]) + 1) % 4]
        kind = i % 4
        if kind < 3:
            text = [spellings[i // 4 % 4].format(r["answer"]), f"({wrong})", "A little girl went home."][kind]
            rows.append({"questionID": r["questionID"], "answer": text})
    rows.append({"questionID": "not-a-gold-id", "answer": "A"})
    return gold, write_jsonl(tmp_path / "answers.jsonl", rows), records


def test_score_command_table_json_and_details(tmp_path, capsys):
    gold, answers, records = mmlu_answers(tmp_path)
    summary, details = tmp_path / "s.json", tmp_path / "d.jsonl"
    assert score_main("--answers", answers, "--gold", gold, "--by", r"mmlu-(.*)-\d+",
                      "--json", summary, "--details", details) == 0
    out = capsys.readouterr().out
    data = json.loads(summary.read_text())
    assert data["overall"] == {"n": 40, "correct": 10, "accuracy": 0.25,
                               "stderr": pytest.approx(math.sqrt(0.25 * 0.75 / 39)), "invalid": 10, "missing": 10}
    assert data["answers_not_in_gold"] == 1 and data["rules"] == {"letter": 40}
    groups = data["groups"]
    assert sum(g["n"] for g in groups.values()) == 40
    assert set(groups) == {r["questionID"].rsplit("-", 1)[0][5:] for r in records}
    assert groups["abstract_algebra"]["n"] == 11
    lines = [json.loads(line) for line in details.read_text().splitlines()]
    assert [d["id"] for d in lines] == [r["questionID"] for r in records]
    assert lines[0] == {"id": "mmlu-abstract_algebra-1", "group": "abstract_algebra", "gold": "A", "rule": "letter",
                        "extracted": "A", "correct": True, "status": "correct", "answer": "A"}
    assert lines[3]["status"] == "missing" and lines[2]["status"] == "invalid"
    assert "all" in out and "25.00%" in out and "answers whose id is not in the gold file: 1 (not scored)" in out
    assert re.search(r"^abstract_algebra +11 ", out, re.M)


def test_score_csv_answers_by_custom_id_column(tmp_path, capsys):
    gold = write_jsonl(tmp_path / "g.jsonl", [{"id": f"g{i}", "answer": str(i)} for i in range(4)])
    answers = tmp_path / "a.csv"
    answers.write_text("id,prediction\ng0,0\ng1,#### 1\ng2,the answer is 5\n")
    assert score_main("--answers", answers, "--gold", gold, "--id-field", "id", "--answer-field", "prediction") == 0
    all_row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("all ")][0]
    assert all_row.split() == ["all", "4", "2", "50.00%", "28.87%", "0", "1"]


def test_a_stopped_runs_unanswered_questions_are_said_apart_from_the_models_failures(tmp_path, capsys):
    """Rows a run never answered (it was stopped first; a merge without their shard) are missing,
    and the table and --json count them apart: the score is of an unfinished run. Written by the
    run's own row writers, in JSON Lines and as OpenAI Batch lines."""
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": f"q{i}", "question": "?", "answer": "1"}
                                              for i in range(4)])
    stopped = not_answered("the run was stopped by signal 2 first")
    rows = [Row("q0", Answer(qid="q0", text="1", finish_reason=FinishReason.STOP, prompt_tokens=3, completion_tokens=1,
                             worker_id=0, ttft_s=0.1, latency_s=0.1)),
            Row("q1", Answer(qid="q1", text="", finish_reason=FinishReason.ERROR, prompt_tokens=3, completion_tokens=0,
                             worker_id=0, ttft_s=0.0, latency_s=0.1, error="the prompt is too long"),
                "the prompt is too long"),
            Row("q2", None, stopped), Row("q3", None, stopped)]
    spec = OutputSpec("openai", model_name="m", started=1.0)
    written = (write_jsonl(tmp_path / "a.jsonl", [row_fields(row, "questionID", False) for row in rows]),
               write_jsonl(tmp_path / "o.jsonl", [batch_line(row, spec) for row in rows]))
    for answers in written:
        summary = tmp_path / "s.json"
        assert score_main("--answers", answers, "--gold", gold, "--json", summary) == 0
        data = json.loads(summary.read_text())
        assert data["not_answered"] == 2 and (data["overall"]["correct"], data["overall"]["missing"]) == (1, 3)
        assert "not answered: 2 of the missing" in capsys.readouterr().out


def test_a_gold_answer_written_as_a_json_number_is_the_decimal_it_is(tmp_path):
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "small", "answer": 0.0000001},
                                              {"questionID": "big", "answer": 1e16}])
    answers = write_jsonl(tmp_path / "a.jsonl", [{"questionID": "small", "answer": "It is 0.0000001."},
                                                 {"questionID": "big", "answer": 10000000000000000}])
    (read, _), (answered, _) = read_gold(str(gold)), read_answers(str(answers))
    assert [g.answer for g in read] == ["0.0000001", "10000000000000000"]
    assert all(score_one(g, answered[g.qid], "auto", "all").correct for g in read)


def test_format_table_without_answers():
    result = ScoreResult(score([Gold("a", "1")], {}, "auto")[0], 0, 0, "a.jsonl", "g.jsonl", "auto")
    table = format_table(result)
    assert "all" in table and "0.00%" in table and "missing" in table


@pytest.mark.model
@pytest.mark.timeout(240)
def test_run_then_score_on_mmlu_with_a_real_model(tmp_path, stories):
    """`run --score`: stories260K's answers are nonsense, so only the table is checked: present,
    and its numbers add up."""
    records = [json.loads(line) for line in require(MMLU, "MMLU's real records").read_text().splitlines()[:6]]
    questions = write_jsonl(tmp_path / "mmlu.jsonl", records)
    out = tmp_path / "answers.jsonl"
    r = ggbatch("run", "--model", stories, "--input", questions, "--output", out, "--max-tokens", 8, "--score")
    assert r.returncode == 0, r.stderr
    assert f"score of {out} against {questions} (extraction: letter for 6)" in r.stdout
    row = [line.split() for line in r.stdout.splitlines() if line.startswith("all ")][0]
    n, correct, accuracy, stderr, invalid, missing = row[1:]
    assert (int(n), int(missing)) == (6, 0) and int(correct) + int(invalid) <= 6
    assert accuracy == f"{100 * int(correct) / 6:.2f}%"
    assert stderr == f"{100 * math.sqrt(int(correct) / 6 * (1 - int(correct) / 6) / 5):.2f}%"
    # the same numbers from `ggbatch score` on the files the run left
    again = score_cli("--answers", out, "--gold", questions)
    assert again.returncode == 0 and " ".join(row) in " ".join(again.stdout.split())
