"""`ggbatch score` as a command: what it refuses in one line (exit 2), and what it warns of."""

from helpers import ggbatch, write_jsonl


def score_cli(*args):
    return ggbatch("score", *args, timeout=60)


def test_unreadable_input_is_one_line_exit_2(tmp_path):
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "a", "answer": "1"}])
    bad = tmp_path / "a.jsonl"
    bad.write_text('{"questionID": "a", "answer": "1"}\nnot json\n')
    r = score_cli("--answers", bad, "--gold", gold)
    assert r.returncode == 2 and r.stderr.startswith(f"ggbatch: error: {bad}:2: malformed JSON")
    assert len(r.stderr.strip().splitlines()) == 1
    r = score_cli("--answers", tmp_path / "nope.jsonl", "--gold", gold)
    assert r.returncode == 2 and "nope.jsonl: input file not found" in r.stderr
    r = score_cli("--answers", gold, "--gold", gold, "--by", "mmlu-(")
    assert r.returncode == 2 and "--by: not a valid regular expression" in r.stderr
    r = score_cli("--answers", gold, "--gold", gold, "--details", gold)
    assert r.returncode == 2 and "is also an input of this score" in r.stderr


def test_an_answer_field_no_row_has_is_refused_naming_the_fields_the_rows_have(tmp_path):
    """A misspelt --answer-field (or answers under another name) scored 0% with exit 0."""
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "a", "answer": "1"}, {"questionID": "b", "answer": "2"}])
    answers = write_jsonl(tmp_path / "a.jsonl", [{"questionID": "a", "answer": "1"}, {"questionID": "b"}])
    r = score_cli("--answers", answers, "--gold", gold, "--answer-field", "answr")
    assert r.returncode == 2 and r.stderr == (f"ggbatch: error: {answers}: no row has an answer 'answr' (the rows "
                                              "have: questionID, answer); name it with --answer-field\n")
    response = write_jsonl(tmp_path / "r.jsonl", [{"questionID": "a", "response": "1"}])
    r = score_cli("--answers", response, "--gold", gold)
    assert r.returncode == 2 and "no row has an answer 'answer' (the rows have: questionID, response)" in r.stderr
    r = score_cli("--answers", answers, "--gold", gold)  # one row without it is a missing answer, as before
    assert r.returncode == 0 and "50.00%" in r.stdout


def test_answers_and_gold_that_are_one_file_are_refused(tmp_path):
    """Scored against itself, a gold file was 100% with exit 0 (a wrong variable in a cron job)."""
    gold = write_jsonl(tmp_path / "g.jsonl", [{"questionID": "a", "answer": "1"}])
    (tmp_path / "link.jsonl").symlink_to(gold)
    for answers in (gold, tmp_path / "link.jsonl"):
        r = score_cli("--answers", answers, "--gold", gold)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr == (f"ggbatch: error: --answers and --gold are the same file ({gold}): scored against "
                            "itself, every answer is right; give the answers file a run wrote\n")


def test_gold_that_is_a_runs_answers_file_and_answers_that_are_not_say_they_look_swapped(tmp_path):
    """--answers and --gold the wrong way round scored 0% with exit 0 and no word of why. A run
    keeps its journal beside its answers file, so a --gold with one and an --answers without is
    warned of; two runs' answers scored against each other (agreement) are not."""
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": "a", "question": "1+1?", "answer": "2"}])
    run = write_jsonl(tmp_path / "a.jsonl", [{"questionID": "a", "answer": "It is 2."}])
    (tmp_path / "a.jsonl.journal.jsonl").write_text("")
    r = score_cli("--answers", questions, "--gold", run)
    assert r.returncode == 0 and "0.00%" in r.stdout
    assert r.stderr == (f"ggbatch score: warning: --gold {run} is a run's answers file (its journal is beside it) "
                        f"and --answers {questions} is not: if they are the wrong way round, every answer scores "
                        "wrong; swap --answers and --gold\n")
    r = score_cli("--answers", run, "--gold", questions)
    assert r.returncode == 0 and "100.00%" in r.stdout and r.stderr == ""
    other = write_jsonl(tmp_path / "b.jsonl", [{"questionID": "a", "answer": "2"}])
    (tmp_path / "b.jsonl.journal.jsonl").write_text("")
    r = score_cli("--answers", other, "--gold", run)
    assert r.returncode == 0 and r.stderr == ""


def test_a_field_not_found_names_the_one_the_file_probably_means(tmp_path):
    """A gold file with `label`, an id column `id`, answers under `prediction`: each refusal listed
    the fields, and now names the flag that reads the likely one."""
    gold = tmp_path / "g.csv"
    gold.write_text("questionID,question,label\na,What is 1+1?,2\n")
    answers = write_jsonl(tmp_path / "a.jsonl", [{"questionID": "a", "answer": "2"}])
    r = score_cli("--answers", answers, "--gold", gold)
    assert (r.returncode, r.stderr) == (2, f"ggbatch: error: {gold}: no record has a gold 'answer' (name it with "
                                           "--gold-field); if 'label' is the gold answer, give --gold-field label\n")
    assert score_cli("--answers", answers, "--gold", gold, "--gold-field", "label").returncode == 0
    by_id = write_jsonl(tmp_path / "i.jsonl", [{"id": "a", "answer": "2"}])
    r = score_cli("--answers", answers, "--gold", by_id)
    assert r.returncode == 2 and r.stderr.endswith("name the id field with --id-field; if 'id' is the id, give "
                                                   "--id-field id\n")
    predicted = write_jsonl(tmp_path / "p.jsonl", [{"questionID": "a", "prediction": "2"}])
    r = score_cli("--answers", predicted, "--gold", gold, "--gold-field", "label")
    assert r.returncode == 2 and r.stderr.endswith("name it with --answer-field; if 'prediction' is the answer, give "
                                                   "--answer-field prediction\n")
