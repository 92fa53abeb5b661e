"""`ggbatch merge`, without a model: answers files of every format written by the run's own
renderer (runner/files/outputs.py) for a whole job and for each of its shards; the shards merged must
be the whole job's file byte for byte, and a merge that would lose, mix or invent answers says so."""

import json
import os
import shutil

import pytest

from ggbatch.runner.errors import ConfigError, InputError
from ggbatch.runner.files.outputs import OutputSpec, Row, render
from ggbatch.runner.files.shards import shard_of
from ggbatch.runner.merge.command import merge_files
from ggbatch.runner.merge.join import MISSING
from ggbatch.runner.merge.parts import read_part
from helpers import answer as make_answer
from helpers import ggbatch as cli
from helpers import write_jsonl

IDS = [f"q{i}" for i in range(1, 31)] + ["7", "007", "é-1", "with, comma"]
TEXTS = {"q3": 'He said "hi",\nthen left', "q4": "<think>2+2</think> 4", "q5": "  ", "q6": "naïve – ünïcödé"}
FAILED = "q9"
EXT = {"json": "json", "jsonl": "jsonl", "csv": "csv", "openai": "jsonl"}


def answer(i, qid):
    error = "the prompt is longer than the context" if qid == FAILED else None
    return make_answer(qid, TEXTS.get(qid, f"answer {i}"), error, prompt_tokens=10 + i, tokens=i,
                       created=1_700_000_000.5 + i)


ROWS = [Row(qid, answer(i, qid), answer(i, qid).error) for i, qid in enumerate(IDS)]


def spec(fmt, keep_thinking=False):
    return OutputSpec(fmt, keep_thinking=keep_thinking, model_name="stories", completions=frozenset({"q2"}),
                      started=1_700_000_000.0)


def write_job(tmp_path, fmt, count=3, keep_thinking=False):
    """(the question file, the whole job's answers as one run writes them, the shards' files)."""
    questions = tmp_path / "questions.jsonl"
    write_jsonl(questions, [{"questionID": q, "question": "?"} for q in IDS])
    whole = tmp_path / f"whole.{EXT[fmt]}"
    whole.write_text(render(ROWS, spec(fmt, keep_thinking)), newline="")
    parts = []
    for i in range(count):
        part = tmp_path / f"answers.shard-{i}-of-{count}.{EXT[fmt]}"
        part.write_text(render([r for r in ROWS if shard_of(r.qid, count) == i], spec(fmt, keep_thinking)),
                        newline="")
        parts.append(str(part))
    return str(questions), whole.read_bytes(), parts


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "openai"])
def test_the_shards_merged_are_the_whole_job_byte_for_byte(tmp_path, fmt):
    questions, whole, parts = write_job(tmp_path, fmt)
    out = tmp_path / f"merged.{EXT[fmt]}"
    outcome = merge_files(str(out), parts[::-1], questions)
    assert out.read_bytes() == whole
    assert outcome.format == fmt and outcome.parts == 3
    assert outcome.problems() == ["1 question has no answer in the parts (the rows say why)"]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_thinking_kept_merges_byte_for_byte(tmp_path, fmt):
    questions, whole, parts = write_job(tmp_path, fmt, keep_thinking=True)
    out = tmp_path / f"merged.{fmt}"
    merge_files(str(out), parts, questions)
    assert out.read_bytes() == whole


def test_a_question_file_whose_template_reads_other_fields_merges_by_its_ids(tmp_path):
    """`run --template '{{ text }}'` takes records without a question field; merge --input took
    them for errors. It needs the ids alone, unless --question-field asks for one."""
    _, whole, parts = write_job(tmp_path, "jsonl")
    questions = write_jsonl(tmp_path / "texts.jsonl", [{"questionID": q, "text": "?"} for q in IDS])
    out = tmp_path / "merged.jsonl"
    merge_files(str(out), parts, str(questions))
    assert out.read_bytes() == whole
    with pytest.raises(InputError, match=r"texts.jsonl:1: record has no 'question' \(fields.question\)"):
        merge_files(str(out), parts, str(questions), question_field="question")


def test_without_the_question_file_rows_come_in_the_parts_order(tmp_path):
    _, _, parts = write_job(tmp_path, "jsonl")
    out = tmp_path / "merged.jsonl"
    outcome = merge_files(str(out), parts)
    got = [json.loads(line)["questionID"] for line in out.read_text().splitlines()]
    assert got == [q for i in range(3) for q in IDS if shard_of(q, 3) == i]
    assert outcome.split == 3 and outcome.absent_shards == []


@pytest.mark.parametrize("source,target", [("jsonl", "json"), ("csv", "json"), ("json", "csv"), ("csv", "jsonl")])
def test_parts_convert_between_json_json_lines_and_csv(tmp_path, source, target):
    questions, _, parts = write_job(tmp_path, source)
    out = tmp_path / f"merged.{target}"
    merge_files(str(out), parts, questions)
    assert out.read_bytes() == render(ROWS, spec(target)).encode()


def test_a_missing_shard_is_named_and_its_questions_marked(tmp_path):
    questions, _, parts = write_job(tmp_path, "jsonl")
    out = tmp_path / "merged.jsonl"
    outcome = merge_files(str(out), [parts[0], parts[2]], questions)
    missing = [q for q in IDS if shard_of(q, 3) == 1]
    assert outcome.merged.missing == missing
    first = ", ".join(repr(q) for q in missing[:5])
    assert outcome.problems() == [
        "no part is named for shard 1/3",
        f"{len(missing)} of {len(IDS)} questions are in no part: {first} and {len(missing) - 5} more (by their ids, "
        f"of shard 1/3); {out} marks them not answered",
        "1 question has no answer in the parts (the rows say why)"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["questionID"] for r in rows] == IDS
    assert [r for r in rows if r["questionID"] in missing] == [
        {"questionID": q, "answer": None, "error": MISSING} for q in missing]


def test_an_absent_part_file_is_named(tmp_path):
    questions, _, parts = write_job(tmp_path, "openai")
    parts[1] = str(tmp_path / "gone.shard-1-of-3.jsonl")
    outcome = merge_files(str(tmp_path / "merged.jsonl"), parts, questions)
    assert outcome.problems()[0] == f"{parts[1]}: not found (an absent shard?)"
    assert "by their ids, of shard 1/3" in outcome.problems()[1]
    lines = [json.loads(line) for line in (tmp_path / "merged.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == IDS
    marked = [x for x in lines if shard_of(x["custom_id"], 3) == 1]
    assert all(x["response"] is None and x["error"] == {"code": "not_answered", "message": MISSING} for x in marked)


def test_duplicate_ids_are_refused_naming_both_files(tmp_path):
    questions, _, parts = write_job(tmp_path, "csv")
    copy = tmp_path / "copy.csv"
    shutil.copy(parts[0], copy)
    qid = read_part(parts[0]).rows[0].qid
    with pytest.raises(InputError, match=f"^id '{qid}' is in two parts: {parts[0]}:2 and {copy}:2 "):
        merge_files(str(tmp_path / "m.csv"), [*parts, str(copy)], questions)
    with pytest.raises(ConfigError, match="given twice as a part"):
        merge_files(str(tmp_path / "m.csv"), [parts[0], parts[0]], questions)
    assert not (tmp_path / "m.csv").exists()


def test_an_id_twice_in_one_part_is_refused_naming_its_lines(tmp_path):
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"questionID": "b", "answer": "0"}, {"questionID": "a", "answer": "1"},
                                               {"questionID": "a", "answer": "2"}])
    with pytest.raises(InputError) as refused:
        merge_files(str(tmp_path / "d.jsonl"), [str(dup)])
    assert str(refused.value) == f"id 'a' appears twice in {dup}, at lines 2 and 3"
    assert not (tmp_path / "d.jsonl").exists()
    # a JSON array on one line: its items, not "lines 1 and 1"
    one_line = tmp_path / "dup.json"
    one_line.write_text('[{"questionID":"a","answer":"x"},{"questionID":"b","answer":"y"},{"questionID":"a"}]')
    with pytest.raises(InputError) as refused:
        merge_files(str(tmp_path / "d.json"), [str(one_line)])
    assert str(refused.value) == f"id 'a' appears twice in {one_line}, at items 1 and 3 of the array (both on line 1)"


def test_an_id_the_question_file_does_not_have_is_refused(tmp_path):
    questions, _, parts = write_job(tmp_path, "json")
    stray = tmp_path / "stray.json"
    stray.write_text('[\n{"questionID": "q1000", "answer": "x"}\n]\n')
    with pytest.raises(InputError, match=f"^{stray}:2: id 'q1000' is not in the question file {questions}$"):
        merge_files(str(tmp_path / "m.json"), [*parts, str(stray)], questions)


def test_openai_parts_into_another_format_are_told_the_way_that_fits_how_it_was_asked(tmp_path):
    """By its name (.json): name it .jsonl; by --output-format on a .jsonl name: drop the flag; by
    --output-format on a .csv name: give openai, or drop the flag and rename."""
    questions, _, parts = write_job(tmp_path, "openai")
    said = {}
    for name, fmt in (("m.json", None), ("m.jsonl", "jsonl"), ("m.csv", "csv")):
        with pytest.raises(ConfigError) as refused:
            merge_files(str(tmp_path / name), parts, questions, output_fmt=fmt)
        said[name] = str(refused.value).split(": ", 2)[-1]
    assert said["m.json"] == "name it .jsonl or give --output-format openai"
    assert said["m.jsonl"] == ("drop --output-format jsonl (its name keeps them as OpenAI Batch output) "
                               "or give --output-format openai")
    assert said["m.csv"] == "give --output-format openai, or drop --output-format csv and name it .jsonl"


def test_an_id_field_the_rows_write_themselves_is_refused(tmp_path):
    """`--id-field answer`: the merged rows' answers would overwrite their ids. Refused before the
    files are read, as a run refuses it: read by it, parts whose answers are alike clash first."""
    part = write_jsonl(tmp_path / "a.jsonl", [{"answer": "q1", "question": "x"}])
    questions = write_jsonl(tmp_path / "gq.jsonl", [{"questionID": f"q{i}", "question": "?", "answer": f"x{i}"}
                                                    for i in (1, 2)])
    alike = write_jsonl(tmp_path / "part.jsonl", [{"questionID": f"q{i}", "answer": "same"} for i in (1, 2)])
    for parts, given in (([part], None), ([alike], questions)):
        with pytest.raises(ConfigError, match=r"^fields.id \(--id-field\): 'answer' is one of the fields ggbatch "):
            merge_files(str(tmp_path / "m.jsonl"), [str(p) for p in parts], given and str(given), id_field="answer")
    assert not (tmp_path / "m.jsonl").exists()


def test_refused_merges(tmp_path):
    questions, _, parts = write_job(tmp_path, "openai")
    with pytest.raises(ConfigError, match="does not convert to json"):
        merge_files(str(tmp_path / "m.json"), parts, questions)
    rows = tmp_path / "rows.shard-0-of-3.jsonl"
    rows.write_text('{"questionID": "q1", "answer": "x"}\n')
    with pytest.raises(InputError, match="holds OpenAI Batch output lines and .*rows.shard-0-of-3.jsonl answers rows"):
        merge_files(str(tmp_path / "m.jsonl"), [parts[1], str(rows)], questions)
    with pytest.raises(ConfigError, match="OpenAI Batch output is made by a run"):
        merge_files(str(tmp_path / "m.jsonl"), [str(rows)], output_fmt="openai")
    with pytest.raises(ConfigError, match=f"the merged output {parts[0]} is a part"):
        merge_files(parts[0], parts, questions)
    journal = tmp_path / "other.jsonl"  # a run's journal under a name of its own
    journal.write_text('{"ggbatch_journal": 1}\n')
    for output in (f"{parts[0]}.journal.jsonl", f"{parts[1]}.lock", str(journal)):
        with pytest.raises(ConfigError, match="is the journal or lock of another output"):
            merge_files(output, parts, questions)
    assert journal.read_text() == '{"ggbatch_journal": 1}\n' and not os.path.exists(f"{parts[1]}.lock")
    other = tmp_path / "a.shard-1-of-4.jsonl"
    shutil.copy(parts[1], other)
    with pytest.raises(InputError, match="parts of two splits: .*shard 0/3, .*a.shard-1-of-4.jsonl is shard 1/4"):
        merge_files(str(tmp_path / "m.jsonl"), [parts[0], str(other)], questions)


def test_an_empty_shard_merges(tmp_path):
    questions, whole, parts = write_job(tmp_path, "openai", count=40)  # more shards than some get questions
    assert any(not read_part(p).rows for p in parts)
    merge_files(str(tmp_path / "m.jsonl"), parts, questions)
    assert (tmp_path / "m.jsonl").read_bytes() == whole


def ggbatch(*args):
    return cli("merge", *args, timeout=60)


@pytest.mark.timeout(120)
def test_the_command_line_exit_codes(tmp_path):
    questions, whole, parts = write_job(tmp_path, "jsonl")
    out = tmp_path / "merged.jsonl"
    r = ggbatch("--input", questions, "--output", out, *parts)
    assert r.returncode == 1 and out.read_bytes() == whole  # one row failed, as the run said (exit 1)
    assert r.stdout == f"merged {len(IDS)} rows from 3 parts into {out} (jsonl, in the order of {questions})\n"
    assert r.stderr == "ggbatch: merge: 1 question has no answer in the parts (the rows say why)\n"
    r = ggbatch("-q", "--input", questions, "--output", out, parts[0], parts[2])
    assert r.returncode == 1 and r.stdout == ""
    assert "questions are in no part: " in r.stderr and "(by their ids, of shard 1/3)" in r.stderr
    r = ggbatch("--input", questions, "--output", out, parts[0], parts[0].replace("answers", "./answers"))
    assert r.returncode == 2 and r.stderr.startswith("ggbatch: error: ") and r.stderr.count("\n") == 1
    nothing = tmp_path / "nothing.jsonl"  # a glob the shell matched to no file is passed on as written
    r = ggbatch("--input", questions, "--output", nothing, str(tmp_path / "answer.shard-*"))
    assert r.returncode == 2 and "no part exists" in r.stderr and not nothing.exists()


def test_a_glob_that_also_matches_the_journals_merges_the_parts(tmp_path):
    """`answers.shard-*.jsonl` matches each part's journal too: those are left out, and said so; a
    journal without its answers file is refused by name."""
    questions, whole, parts = write_job(tmp_path, "jsonl")
    journals = [f"{p}.journal.jsonl" for p in parts]
    for journal in journals:
        shutil.copy(parts[0], journal)  # what a journal holds does not matter: it is not read as a part
    out = tmp_path / "merged.jsonl"
    outcome = merge_files(str(out), sorted(parts + journals), questions)
    assert out.read_bytes() == whole and outcome.parts == 3 and outcome.journals == 3
    with pytest.raises(ConfigError, match=r"shard-1-of-3.jsonl.journal.jsonl: a run's journal, not an answers file"):
        merge_files(str(out), [parts[0], journals[1]], questions)


@pytest.mark.parametrize("key, value, said", [
    ("answer.labelled_choices", "their texts, unless the prompt lists them beside their labels",
     "the ggbatch version that answered {0} scored a record's labelled choices by their texts, unless the prompt "
     "lists them beside their labels, and the one that answered {1} scored them by their labels"),
    ("answer.choice_scoring_context", "after an empty thinking block",
     "the ggbatch version that answered {0} scored a thinking model's choices after an empty thinking block, and "
     "the one that answered {1} scored them inside the open thinking block"),
])
def test_parts_whose_journals_differ_in_ggbatch_own_rules_are_refused_in_words(tmp_path, key, value, said):
    """A key ggbatch writes for itself (no setting a user gives) was named as 'answer.labelled_choices':
    said in words, as a run's resume refusal says it (runner/journal/fingerprint.py RULES)."""
    questions, _, parts = write_job(tmp_path, "jsonl", count=2)
    settings = {"model": "abc", "max_tokens": 8, "answer": {"choices": [], "grammar": None}}
    for part, fingerprint in zip(parts, ({**settings, key: value}, settings)):  # the second: an older version's
        with open(f"{part}.journal.jsonl", "w") as f:
            f.write(json.dumps({"ggbatch_journal": 1, "fingerprint": fingerprint}) + "\n")
    with pytest.raises(ConfigError) as refused:
        merge_files(str(tmp_path / "m.jsonl"), parts, questions)
    assert str(refused.value) == (f"parts of two jobs: {said.format(*parts)} (as their journals say); merge the "
                                  "shards of one job")
    (tmp_path / "links").mkdir()  # a run's journal is beside the file its output path leads to
    links = [tmp_path / "links" / os.path.basename(part) for part in parts]
    for link, part in zip(links, parts):
        link.symlink_to(part)
    with pytest.raises(ConfigError, match="parts of two jobs"):
        merge_files(str(tmp_path / "m.jsonl"), list(map(str, links)), questions)


def test_parts_of_two_answer_grammars_are_refused_without_the_grammars_text(tmp_path):
    questions, _, parts = write_job(tmp_path, "jsonl", count=2)
    for part, grammar in zip(parts, ('root ::= "{" ws "}"\nws ::= [ \\t]*', 'root ::= "[" "]"')):
        answer = {"choices": [], "grammar": grammar}
        with open(f"{part}.journal.jsonl", "w") as f:
            f.write(json.dumps({"ggbatch_journal": 1, "fingerprint": {"model": "abc", "answer": answer}}) + "\n")
    with pytest.raises(ConfigError) as refused:
        merge_files(str(tmp_path / "m.jsonl"), parts, questions)
    assert str(refused.value) == (f"parts of two jobs: {parts[0]} and {parts[1]} were answered with different "
                                  "grammars (answer.json_schema, or answer.grammar, as their journals say); merge "
                                  "the shards of one job")


@pytest.mark.timeout(60)
def test_one_row_from_one_part_is_said_in_the_singular(tmp_path):
    """It said 'merged 1 rows from 1 parts'."""
    part = tmp_path / "a.shard-0-of-1.jsonl"
    part.write_text(json.dumps({"questionID": "q", "answer": "yes"}) + "\n")
    r = ggbatch("--output", tmp_path / "m.jsonl", part)
    assert r.returncode == 0 and r.stdout == f"merged 1 row from 1 part into {tmp_path / 'm.jsonl'} (jsonl, in the " \
                                             "parts' order)\n", r.stdout
