"""`ggbatch score` on texts for choices (HellaSwag-style records, the answers log-likelihood
scoring writes), and maj@k / pass@k over every gold question with votes on the values compared."""

import json

import pytest

from ggbatch.runner.scoring.command import score_files
from ggbatch.runner.scoring.rules import Gold, score_one
from ggbatch.runner.scoring.table import format_table, summary
from helpers import ggbatch, write_jsonl

# HellaSwag-style records: a list of texts, the gold answer one of them (a tester's file, trimmed)
TEXT_CHOICES = [
    {"questionID": "h1", "question": "The cat sat on the", "choices": ["mat", "dog ran away quickly", "a"],
     "answer": "mat"},
    {"questionID": "h2", "question": "Lily went to the park and", "choices": ["played with her ball.", "cried.", "ate"],
     "answer": "cried."},
    {"questionID": "h_uni", "question": "She said", "choices": ["héllo ☃", "你好", "hi"], "answer": "hi"},
    {"questionID": "h_one", "question": "It was", "choices": ["sunny"], "answer": "sunny"},
    {"questionID": "h_space", "question": "The dog", "choices": [" barked", "  barked", "\nbarked"],
     "answer": " barked"},
]
# what `--choices auto --choice-scoring loglikelihood` wrote for them with stories260K
TEXT_ANSWERS = [
    {"questionID": "h1", "answer": "a", "answer_norm": "dog ran away quickly"},
    {"questionID": "h2", "answer": "ate", "answer_norm": "played with her ball."},
    {"questionID": "h_uni", "answer": "hi", "answer_norm": "hi"},
    {"questionID": "h_one", "answer": "sunny", "answer_norm": "sunny"},
    {"questionID": "h_space", "answer": "barked", "answer_norm": " barked"},
]


def details_of(result):
    return {s.qid: (s.extracted, s.status) for s in result.scored}


def test_text_choices_score_by_the_choice_the_text_names(tmp_path):
    gold = write_jsonl(tmp_path / "hs.jsonl", TEXT_CHOICES)
    answers = write_jsonl(tmp_path / "out.jsonl", TEXT_ANSWERS)
    result = score_files(str(answers), str(gold))
    assert details_of(result) == {
        "h1": ("C", "wrong"),  # "a" is the third choice's text, not the letter A
        "h2": ("C", "wrong"),
        "h_uni": ("C", "correct"),  # "hi" names the third choice, not letters H and I
        "h_one": ("A", "correct"),
        "h_space": ("A", "correct"),  # the answer stripped: the first of the equal choices
    }
    norm = score_files(str(answers), str(gold), answer_field="answer_norm")
    assert [s.status for s in norm.scored] == ["wrong", "wrong", "correct", "correct", "correct"]
    assert format_table(norm).startswith(f"score of {answers} (answer_norm) against {gold}")


@pytest.mark.parametrize("answer, expected", [
    ("cried.", "B"), ("Cried", "B"), ("  cried.  ", "B"),  # the text, stripped, normalised
    ("B", "B"), ("The answer is (C).", "C"),  # a letter still names its choice
    ("laughed", None),
])
def test_a_text_answer_or_a_letter_names_a_choice_of_a_text_gold(answer, expected):
    gold = Gold("h2", "cried.", {"A": "played with her ball.", "B": "cried.", "C": "ate"})
    scored = score_one(gold, answer, "auto", "all")
    assert scored.extracted == expected and scored.correct == (expected == "B")


def test_a_letter_gold_still_reads_a_letter_first():
    # MMLU's chemistry: choice texts that are letters; the gold answer "B" names letter B
    gold = Gold("q", "B", {"A": "C", "B": "N", "C": "O", "D": "H"})
    assert score_one(gold, "C", "auto", "all").status == "wrong"  # the letter C (O), not the text C (A)
    assert score_one(gold, "N", "auto", "all").status == "correct"  # the text of choice B
    assert score_one(gold, "B", "auto", "all").status == "correct"


def test_more_than_ten_text_choices_are_scored_as_run_takes_them(tmp_path):
    choices = [f"ending number {i}" for i in range(12)]
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "q", "question": "x", "choices": choices,
                                               "answer": "ending number 11"},
                                              {"questionID": "r", "question": "x", "choices": choices,
                                               "answer": "ending number 2"}])
    answers = write_jsonl(tmp_path / "a.jsonl", [{"questionID": "q", "answer": "ending number 11"},
                                                 {"questionID": "r", "answer": "ending number 10"}])
    r = ggbatch("score", "--answers", answers, "--gold", gold, "--details", tmp_path / "d.jsonl")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [(d["extracted"], d["status"]) for d in rows] == [("12", "correct"), ("11", "wrong")]


def test_openai_lines_give_their_acc_norm_pick_to_answer_field_answer_norm(tmp_path):
    gold = write_jsonl(tmp_path / "g.jsonl", TEXT_CHOICES[:2])
    lines = [{"custom_id": a["questionID"], "error": None,
              "response": {"status_code": 200, "body": {"choices": [
                  {"index": 0, "message": {"role": "assistant", "content": a["answer"]},
                   "answer_norm": a["answer_norm"]}]}}} for a in TEXT_ANSWERS[:2]]
    answers = write_jsonl(tmp_path / "oai.jsonl", lines)
    acc = score_files(str(answers), str(gold))
    norm = score_files(str(answers), str(gold), answer_field="answer_norm")
    assert [s.raw for s in acc.scored] == ["a", "ate"]
    assert [s.raw for s in norm.scored] == ["dog ran away quickly", "played with her ball."]


# -- maj@k and pass@k -------------------------------------------------------------------------------

GOLD = [{"questionID": f"q{i}", "question": "x", "answer": a}
        for i, a in enumerate(["18", "5", "7", "3", "10", "2"], 1)]
SAMPLED = [  # a tester's answers; q6 failed
    {"questionID": "q1", "answer": ["#### 18", "18.00", "$18", "17", "17"]},
    {"questionID": "q2", "answer": ["4", "5", "4", "5", "no idea"]},
    {"questionID": "q3", "answer": ["no", "nothing", "7", "7", "x"]},
    {"questionID": "q4", "answer": ["3", "3", "3", "3", "3"]},
    {"questionID": "q5", "answer": ["1", "2", "3", "4", "10"]},
    {"questionID": "q6", "answer": None, "error": "worker died"},
]


def test_a_question_without_an_answer_is_wrong_in_maj_and_pass_at_k(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", GOLD)
    result = score_files(str(write_jsonl(tmp_path / "ans.jsonl", SAMPLED)), str(gold))
    got = summary(result)["samples"]
    assert (got["questions"], got["with_samples"], got["without_answer"]) == (6, 5, 1)
    assert got["maj@5"] == pytest.approx(2 / 6)  # q1 and q4 over all six, as the accuracy's n
    assert got["pass@1"] == pytest.approx((3 / 5 + 2 / 5 + 2 / 5 + 1 + 1 / 5 + 0) / 6)
    assert got["pass@5"] == pytest.approx(5 / 6)
    assert ("samples    maj@5 33.33% (2 correct by majority vote), pass@1 43.33%, pass@5 83.33% over 6 questions: "
            "5 with samples, 1 without an answer (wrong)") in format_table(result)


def test_a_single_answer_among_samples_is_a_vote_of_one(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", GOLD[:4])
    answers = write_jsonl(tmp_path / "ans.jsonl", [{"questionID": "q1", "answer": ["18", "18", "17"]},
                                                   {"questionID": "q2", "answer": "5"},
                                                   {"questionID": "q3", "answer": ["7"]}])
    got = summary(score_files(str(answers), str(gold)))["samples"]
    assert (got["questions"], got["with_samples"], got["with_one_answer"], got["without_answer"]) == (4, 1, 2, 1)
    assert got["k"] == 3 and got["maj@3"] == 0.75  # q1 by vote, q2 and q3 alone; q4 missing
    assert got["pass@1"] == pytest.approx((2 / 3 + 1 + 1 + 0) / 4)
    assert got["pass@3"] == 0.75


def test_maj_votes_on_numbers_as_decimals(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", GOLD[:1])
    answers = write_jsonl(tmp_path / "ans.jsonl", [{"questionID": "q1", "answer": ["17", "17", "18", "18.0", "18.00"]}])
    result = score_files(str(answers), str(gold))
    assert summary(result)["samples"]["maj@5"] == 1.0  # 18 three times, 17 twice
    table = format_table(result)
    assert "over 1 question (" in table and "over 1 question:" in table  # one question, not "1 questions"


def test_maj_ties_go_to_the_first_value_and_exact_votes_are_normalised(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", [{"questionID": "a", "question": "x", "answer": "5"},
                                                 {"questionID": "b", "question": "x", "answer": "Paris"}])
    answers = write_jsonl(tmp_path / "ans.jsonl", [{"questionID": "a", "answer": ["4", "5.0", "4.00", "5"]},
                                                   {"questionID": "b", "answer": ["paris.", "Rome", "PARIS", "rome"]}])
    got = summary(score_files(str(answers), str(gold)))["samples"]
    assert got["maj_correct"] == 1  # a: 4 and 5 tie, 4 came first; b: Paris twice, Rome twice, paris first


@pytest.mark.model
@pytest.mark.timeout(240)
def test_run_score_on_log_likelihood_answers_scores_acc_and_acc_norm(tmp_path, stories):
    questions = write_jsonl(tmp_path / "hs.jsonl", TEXT_CHOICES)
    out = tmp_path / "out.jsonl"
    r = ggbatch("run", "--model", stories, "--input", questions, "--output", out, "--choices", "auto",
                "--choice-scoring", "loglikelihood", "--progress", "off", "--score")
    assert r.returncode == 0, r.stderr
    assert f"score of {out} against {questions} (extraction: letter for 5)" in r.stdout
    assert f"score of {out} (answer_norm) against {questions} (extraction: letter for 5)" in r.stdout
    for field in ("answer", "answer_norm"):  # each table as `ggbatch score` prints it
        again = ggbatch("score", "--answers", out, "--gold", questions, "--answer-field", field)
        assert again.returncode == 0 and again.stdout.strip() in r.stdout


# -- choices as other tools write them: Hugging Face's shapes, CSV cells, failed rows -----------

# ARC as Hugging Face's to_json writes it (labels of its own; some ARC questions number them 1-4),
# MMLU and PIQA as cais/mmlu and piqa give theirs (a list, the gold answer an index into it)
HF_RECORDS = [
    {"questionID": "arc1", "question": "Which is a planet?",
     "choices": {"text": ["Moon", "Mars", "Sun"], "label": ["A", "B", "C"]}, "answer": "B"},
    {"questionID": "arc2", "question": "Which is a gas?",
     "choices": {"text": ["ice", "steam", "rock", "sand"], "label": ["1", "2", "3", "4"]}, "answer": "2"},
    {"questionID": "mmlu1", "question": "1 + 1?", "choices": ["1", "2", "3"], "answer": 1},
    {"questionID": "mmlu2", "question": "Colour of grass?", "choices": ["red", "green", "blue"], "answer": 1},
]


def test_hugging_face_choice_shapes_and_index_golds_score_as_lm_eval_reads_them(tmp_path):
    gold = write_jsonl(tmp_path / "hf.jsonl", HF_RECORDS)
    right = write_jsonl(tmp_path / "right.jsonl", [{"questionID": "arc1", "answer": "B"},
                                                   {"questionID": "arc2", "answer": "2"},
                                                   {"questionID": "mmlu1", "answer": "2"},
                                                   {"questionID": "mmlu2", "answer": "green"}])
    result = score_files(str(right), str(gold))
    assert details_of(result) == {"arc1": ("B", "correct"), "arc2": ("2", "correct"), "mmlu1": ("B", "correct"),
                                  "mmlu2": ("B", "correct")}
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"questionID": "arc2", "answer": "3"},
                                                   {"questionID": "mmlu1", "answer": "1"}])
    statuses = {s.qid: s.status for s in score_files(str(wrong), str(gold)).scored}
    assert statuses["arc2"] == statuses["mmlu1"] == "wrong"  # the index 1 is the text "2", not the choice "1"


def test_an_index_past_the_choices_names_the_line_and_a_gold_naming_no_choice_is_said(tmp_path):
    past = write_jsonl(tmp_path / "past.jsonl", [{"questionID": "a", "choices": ["x", "y"], "answer": 2}])
    answered = write_jsonl(tmp_path / "answered.jsonl", [{"questionID": "a", "answer": "x"}])
    r = ggbatch("score", "--answers", answered, "--gold", past, timeout=60)
    assert r.returncode == 2 and f"{past}:1: gold 'answer' 2 is an index into 'choices'" in r.stderr
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "a", "choices": {"A": "x", "B": "y"}, "answer": "E"},
                                              {"questionID": "b", "choices": {"A": "x", "B": "y"}, "answer": "A"}])
    answers = write_jsonl(tmp_path / "a.jsonl", [{"questionID": "a", "answer": "E"},
                                                 {"questionID": "b", "answer": "A"}])
    result = score_files(str(answers), str(gold))
    assert result.gold_naming_no_choice == ("a",) and summary(result)["gold_naming_no_choice"] == 1
    assert "gold answers that name none of their record's choices: 1 (first: a;" in format_table(result)


def test_csv_choices_cells_and_failed_rows_score_as_their_json_twins(tmp_path):
    gold = tmp_path / "g.csv"
    gold.write_text('questionID,question,choices,answer\n'
                    'c1,?,"[""x"", ""y""]",B\n'
                    "c2,?,\"['a dog', 'a cat']\",a cat\n"
                    'c3,?,"{""A"": ""p"", ""B"": ""q""}",A\n', encoding="utf-8")
    answers = tmp_path / "a.csv"  # c3 failed: an empty answer beside its error, as ggbatch writes it
    answers.write_text("questionID,answer,error\nc1,y,\nc2,B,\nc3,,\"cut by max_tokens\"\n", encoding="utf-8")
    result = score_files(str(answers), str(gold))
    assert details_of(result) == {"c1": ("B", "correct"), "c2": ("B", "correct"), "c3": (None, "missing")}


def test_an_empty_csv_choices_cell_is_a_record_without_choices(tmp_path):
    gold = tmp_path / "g.csv"  # q1 has no choices: in CSV its cell can only be empty
    gold.write_text('questionID,question,answer,choices\nq1,a,18,\nq2,b,B,"{""A"": ""x"", ""B"": ""y""}"\n',
                    encoding="utf-8")
    answers = tmp_path / "a.jsonl"
    answers.write_text('{"questionID": "q1", "answer": "18"}\n{"questionID": "q2", "answer": "B"}\n', encoding="utf-8")
    result = score_files(str(answers), str(gold))
    assert details_of(result) == {"q1": ("18", "correct"), "q2": ("B", "correct")}


def test_a_null_first_sample_is_a_missing_answer_and_still_an_invalid_vote(tmp_path):
    """A first sample cut short scored as an invalid answer and showed as "" in --details, where
    with n = 1 it would have failed its question: missing, null."""
    gold = write_jsonl(tmp_path / "gold.jsonl", [{"questionID": q, "answer": "5"} for q in "abc"])
    answers = write_jsonl(tmp_path / "ans.jsonl", [{"questionID": "a", "answer": [None, "5", "5"]},
                                                   {"questionID": "b", "answer": None},
                                                   {"questionID": "c", "answer": [None, None, "5"]}])
    details = tmp_path / "d.jsonl"
    done = ggbatch("score", "--answers", answers, "--gold", gold, "--details", details, "--json", tmp_path / "s.json",
                   timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {row["id"]: row for row in map(json.loads, details.read_text().splitlines())}
    assert {q: (row["status"], row["answer"]) for q, row in rows.items()} == {
        "a": ("missing", None), "b": ("missing", None), "c": ("missing", None)}
    got = json.loads((tmp_path / "s.json").read_text())
    assert (got["overall"]["invalid"], got["overall"]["missing"], got["overall"]["correct"]) == (0, 3, 0)
    # the votes: a's two fives beat its null; c's two nulls are one [invalid] value that wins
    assert got["samples"]["maj_correct"] == 1
