"""The command line and the Python API as a careful user meets them: one string given to answer(), keyword
arguments that are not settings, a reader that leaves the pipe early, choices the model cannot spell, a stop
in the first moments of a run, and messages that say values as the user wrote them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import ggbatch
from conftest import MODELS, ROOT, require
from ggbatch.runner.errors import quote
from helpers import ggbatch_command as ggbatch_cmd
from helpers import write_questions

TINYSTORIES = MODELS / "TinyStories-656K-Q8_0.gguf"


def flags(model: str, questions: Path, out: Path, *more: object) -> list[object]:
    return ["--model", model, "--input", questions, "--output", out, "--max-tokens", 4, "--workers", 1, *more]


# -- answer() takes one string as one question, and refuses what it cannot iterate as questions


@pytest.mark.model
@pytest.mark.timeout(120)
def test_answer_takes_one_string_as_one_question(demo_model):
    answers = ggbatch.answer("Once upon a time", model=demo_model, max_tokens=4)
    assert len(answers) == 1
    assert answers[0].id == "0" and answers[0].text and answers[0].error is None


@pytest.mark.parametrize("questions, kind", [({"question": "Hi?"}, "dict"), (b"Hello", "bytes"), (42, "int"),
                                             (None, "NoneType")])
def test_answer_refuses_questions_of_the_wrong_kind(questions, kind):
    # before any model is opened: the model path is never looked at
    with pytest.raises(ggbatch.GgbatchError, match=rf"ggbatch.answer\(\): questions must be .*, got {kind}"):
        ggbatch.answer(questions, model="no-such-model.gguf")


def test_answer_refuses_an_item_of_the_wrong_kind_naming_its_index():
    with pytest.raises(ggbatch.GgbatchError, match=r"questions\[1\] must be a string, a record .* got int"):
        ggbatch.answer(["Hi?", 7], model="no-such-model.gguf")


# -- keyword arguments that are answer()'s own or no setting at all; errors said of the caller's list


@pytest.mark.parametrize("name", ["output", "input", "output_format", "errors_output"])
def test_answer_names_an_argument_of_its_own_instead_of_a_type_error(name):
    with pytest.raises(ggbatch.GgbatchError, match=rf"ggbatch.answer\(\): {name}= is not taken here"):
        ggbatch.answer(["Hi?"], model="no-such-model.gguf", **{name: "x.json"})


def test_an_unknown_keyword_argument_lists_the_valid_ones():
    with pytest.raises(ggbatch.GgbatchError) as err:
        ggbatch.answer(["Hi?"], model="no-such-model.gguf", max_tokenz=3)
    message = str(err.value)
    assert "unknown key 'max_tokenz' (did you mean 'max_tokens'?)" in message
    assert "keyword arguments: " in message and "resume_dir" in message and "sampling" in message
    assert "output" not in message.split("keyword arguments: ")[1].split(", ")
    with pytest.raises(ggbatch.GgbatchError, match=r"ggbatch.run\(\): unknown key 'sampling_temperature'.*"
                                                   r"keyword arguments: .*fresh"):
        ggbatch.run(model="m.gguf", input="q.jsonl", output="a.json", sampling_temperature=0.5)


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_record_without_a_question_is_named_by_its_index_in_the_callers_list(demo_model):
    with pytest.raises(ggbatch.GgbatchError) as err:
        ggbatch.answer(["Once upon a time", {"text": "no question field"}], model=demo_model, max_tokens=4)
    assert str(err.value) == ("ggbatch.answer(): questions[1]: record has no 'question' (fields.question); its other "
                              "fields: 'text'; if 'text' is the question, set fields.question: text (--question-field "
                              "text)")
    with pytest.raises(ggbatch.GgbatchError, match=r"duplicate questionID: 'a' \(questions\[0\] and \[2\]\)"):
        ggbatch.answer([{"questionID": i, "question": q} for i, q in (("a", "Hi"), ("b", "Yo"), ("a", "Ho"))],
                       model=demo_model, max_tokens=4)


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_lone_surrogate_in_a_question_is_that_questions_error(demo_model):
    answers = ggbatch.answer(["Once \ud800 upon", "Once upon a time"], model=demo_model, max_tokens=3)
    assert answers[0].text is None and "surrogate" in answers[0].error
    assert answers[1].text and answers[1].error is None


def test_a_record_json_cannot_spell_is_named_by_its_index():
    with pytest.raises(ggbatch.GgbatchError, match=r"questions\[0\]: .*set"):
        ggbatch.answer([{"question": "Hi", "tags": {"a"}}], model="no-such-model.gguf")


# -- a reader that leaves early (`| true`, `| head -1`) is no error


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_closed_stdout_ends_quietly_with_the_runs_own_code(tmp_path, demo_model):
    questions = write_questions(tmp_path / "q.jsonl", 3, gold=True)
    out = tmp_path / "a.jsonl"
    commands = [ggbatch_cmd("run", *flags(demo_model, questions, out, "--score")),
                ggbatch_cmd("score", "--answers", out, "--gold", questions)]
    for command in commands:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # the reader is gone before the first line, as `| true`
        stderr = proc.stderr.read()
        assert proc.wait(timeout=90) == 0, stderr
        assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr
    assert len(out.read_text().splitlines()) == 3  # every answer written


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("stderr", ["closed", "gone", "shared"])
def test_a_closed_or_gone_stderr_answers_everything(tmp_path, demo_model, stderr):
    """A cron job's stderr closed (`2>&-`), a stderr reader gone (`2> >(true)`), or both streams
    to a reader that leaves (`|& head -1`): every question answered, the run's own exit code."""
    questions = write_questions(tmp_path / "q.jsonl", 3)
    out = tmp_path / "a.jsonl"
    command = [str(c) for c in ggbatch_cmd("run", *flags(demo_model, questions, out, "--progress", "bar"))]
    if stderr == "closed":
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=lambda: os.close(2))
    else:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL if stderr == "gone" else subprocess.PIPE,
                                stderr=subprocess.PIPE if stderr == "gone" else subprocess.STDOUT)
        (proc.stderr if stderr == "gone" else proc.stdout).close()
    assert proc.wait(timeout=90) == 0
    assert len(out.read_text().splitlines()) == 3


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("encoding", [{"LC_ALL": "C", "PYTHONUTF8": "0"}, {"PYTHONIOENCODING": "ascii"}])
def test_a_stdout_that_cannot_write_the_summarys_signs_gets_replacements(tmp_path, demo_model, encoding):
    """A cron job's C locale (ASCII) or an ISO-8859 one: the summary's "×" failed the command,
    exit 1, after every answer was written."""
    questions = write_questions(tmp_path / "q.jsonl", 3)
    out = tmp_path / "a.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIO", "PYTHONUTF8"))}
    done = subprocess.run([str(c) for c in ggbatch_cmd("run", *flags(demo_model, questions, out))], cwd=ROOT,
                          env={**env, **encoding}, capture_output=True, timeout=90)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"layout     1 worker ? " in done.stdout and len(out.read_text().splitlines()) == 3


# -- choices the vocabulary cannot spell are refused before any work


@pytest.mark.model
@pytest.mark.timeout(120)
def test_choices_the_vocabulary_cannot_spell_are_exit_2_naming_the_choice(tmp_path):
    model = require(TINYSTORIES, "TinyStories' vocabulary, whose byte tokens cannot write α")  # 77 of them
    questions = write_questions(tmp_path / "q.jsonl", 3)
    out = tmp_path / "a.jsonl"
    r = subprocess.run(ggbatch_cmd("run", *flags(str(model), questions, out, "--choices", "A,α,β")), cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("ggbatch: error: answer.choices: 'α': the model's vocabulary has no token for "
                                "U+03B1"), r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_records_own_choice_the_vocabulary_cannot_spell_fails_that_record_naming_it(tmp_path):
    """answer.choices auto: the record's choices are the data's, checked as the records come, so
    one the model cannot write fails its record (it could never have won) and the others go on."""
    model = require(TINYSTORIES, "TinyStories' vocabulary, without '/' or byte tokens")
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"questionID": qid, "question": "Once", "choices": choices}) + "\n"
                                 for qid, choices in (("u", ["dog", "c/d", "cat"]), ("ok", ["dog", "cat"]))))
    out = tmp_path / "a.jsonl"
    r = subprocess.run(ggbatch_cmd("run", *flags(str(model), questions, out, "--choices", "auto")), cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 1, r.stderr
    rows = {row["questionID"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["u"] == {"questionID": "u", "answer": None, "error": "its choice 'c/d' cannot be an answer: the "
                         "model's vocabulary has no token for U+002F / (and no byte fallback)"}
    assert rows["ok"]["answer"] in ("dog", "cat")


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_schema_whose_first_character_the_vocabulary_cannot_write_is_refused_before_any_question(tmp_path):
    """Every question ran, then failed with 'the answer's grammar allows no token of this model's
    vocabulary here' (exit 1): the vocabulary has no '{', which every object starts with."""
    model = require(TINYSTORIES, "TinyStories' vocabulary, without '{' or byte tokens")
    questions, out, schema = write_questions(tmp_path / "q.jsonl", 2), tmp_path / "a.jsonl", tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    r = subprocess.run(ggbatch_cmd("run", *flags(str(model), questions, out, "--json-schema", schema)), cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 2 and not out.exists(), r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "ggbatch: error: answer.json_schema: every answer to it starts with '{': the model's vocabulary has no "
        "token for U+007B { (and no byte fallback), so no answer can be written")


@pytest.mark.model
@pytest.mark.timeout(120)
def test_choices_spelled_with_byte_tokens_are_answered(tmp_path, demo_model):
    # the demo vocabulary has all 256 byte tokens: α is two of them, and the grammar can write it
    questions = write_questions(tmp_path / "q.jsonl", 2)
    out = tmp_path / "a.jsonl"
    r = subprocess.run(ggbatch_cmd("run", *flags(demo_model, questions, out, "--choices", "α,β", "-q")), cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert {json.loads(line)["answer"] for line in out.read_text(encoding="utf-8").splitlines()} <= {"α", "β"}


# -- a stop in the first moments ends the run as a later one does


def takes_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM now (Linux: SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def processes_of_tmpdir(tmp: Path) -> list[psutil.Process]:
    """The processes started with TMPDIR=tmp (a run's workers and tokenizer inherit it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TMPDIR") == str(tmp):
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_in_the_first_moments_ends_the_run_as_documented(tmp_path, demo_model):
    # Work enough that no run is over before its signal comes, even on a quiet machine.
    questions = write_questions(tmp_path / "q.jsonl", 300)
    documented = 0
    for moment in (0.05, 0.3, 0.8, 1.5):
        tmp = tmp_path / f"tmp-{moment}"
        tmp.mkdir()
        out = tmp_path / f"a-{moment}.json"
        proc = subprocess.Popen(ggbatch_cmd("run", *flags(demo_model, questions, out, "--max-tokens", 64,
                                                          "--ignore-eos",
                                                          "--threads", 1)), cwd=ROOT,
                                env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        time.sleep(moment)
        taken = takes_sigterm(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        if proc.returncode == -signal.SIGTERM:
            # The interpreter had not reached ggbatch's first line: nothing was started to leave behind.
            # It reaches it in about 0.2 s on 2 busy cores (a load of 6): from 0.8 s the signal is ggbatch's.
            assert not taken, f"at {moment} s: killed by SIGTERM although ggbatch had a handler"
            assert moment < 0.8, f"at {moment} s: killed by SIGTERM: ggbatch did not hold the signal yet"
        else:
            documented += 1
            assert proc.returncode == 143, f"at {moment} s: {stderr}"
            assert "stopped by signal 15" in stderr and "Traceback" not in stderr, stderr
            rows = json.loads(out.read_text())
            assert [r["questionID"] for r in rows] == [f"q{i}" for i in range(300)]
            assert all(r["answer"] is not None or r["error"] == "not answered: the run was stopped by signal 15 "
                       "first" for r in rows)
        assert list(tmp.iterdir()) == [], f"at {moment} s: left behind {list(tmp.iterdir())}"
        _, alive = psutil.wait_procs(processes_of_tmpdir(tmp), timeout=5)
        assert not alive, f"at {moment} s: left running {alive}"
    assert documented >= 2  # from 0.8 s at the latest, ggbatch holds the signal


@pytest.mark.model
@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_group_while_the_children_start_ends_the_run_as_documented(tmp_path, demo_model,
                                                                                        signum):
    """A terminal's Ctrl-C (systemd's and Slurm's SIGTERM too) reaches every process of the
    group: the children still starting too, which used to die of it (a traceback each, exit 2,
    "the tokenizer process died loading the vocabulary"). Now the coordinator alone answers it."""
    questions = write_questions(tmp_path / "q.jsonl", 40)
    for moment in (0.0, 0.15):
        out = tmp_path / f"a-{moment}.json"
        proc = subprocess.Popen(ggbatch_cmd("run", *flags(demo_model, questions, out, "--max-tokens", 64)), cwd=ROOT,
                                start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the first child: the tokenizer or a worker, spawned (a fresh interpreter importing its modules)
        deadline = time.monotonic() + 60
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.005)
        time.sleep(moment)
        os.killpg(proc.pid, signum)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signum, f"at {moment} s: {stderr}"
        assert f"stopped by signal {signum}" in stderr and "Traceback" not in stderr and "died" not in stderr, stderr
        assert [r["questionID"] for r in json.loads(out.read_text())] == [f"q{i}" for i in range(40)]


# -- messages say values as the user wrote them; grammar and schema flags read files


def test_values_are_quoted_in_json_spelling():
    assert [quote(v) for v in (True, False, None, (), ("A", "B"), [True, 1.5], {"a": None}, "yes")] == \
        ["true", "false", "null", "[]", '["A", "B"]', "[true, 1.5]", '{"a": null}', "'yes'"]


def job(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(f"model: m.gguf\ninput: q.jsonl\noutput: a.json\n{text}", encoding="utf-8")
    return str(path)


def test_a_yaml_boolean_where_a_word_was_meant_is_said_in_yaml_with_a_hint(tmp_path):
    path = job(tmp_path, "answer:\n  choices: [yes, no]\n")
    with pytest.raises(ggbatch.GgbatchError) as err:
        ggbatch.build_config([(path, ggbatch.load_job_file(path))])
    assert "got [true, false] (YAML reads yes, no, on and off as true and false" in str(err.value)
    path = job(tmp_path, "max_tokens: yes\n")
    with pytest.raises(ggbatch.GgbatchError, match=r"max_tokens: must be an integer, got true \(YAML"):
        ggbatch.build_config([(path, ggbatch.load_job_file(path))])


def test_a_duplicate_key_in_a_job_file_names_the_file_line_and_key(tmp_path):
    path = job(tmp_path, "max_tokens: 8\nsampling:\n  seed: 1\n  temperature: 0\n  seed: 2\n")
    with pytest.raises(ggbatch.GgbatchError) as err:
        ggbatch.load_job_file(path)
    assert str(err.value) == f"{path}:8: duplicate key 'seed' (first on line 6)"
    path = job(tmp_path, "max_tokens: 8\nmax_tokens: 16\n")
    with pytest.raises(ggbatch.GgbatchError, match=r"job.yaml:5: duplicate key 'max_tokens' \(first on line 4\)"):
        ggbatch.load_job_file(path)


def command_line(**flags: str) -> ggbatch.JobConfig:
    layer = {"model": "m.gguf", "input": "q.jsonl", "output": "a.json", **flags}
    return ggbatch.build_config([("command line", layer)])


def test_a_grammar_flag_naming_a_file_reads_it(tmp_path, monkeypatch):
    (tmp_path / "yn.gbnf").write_text('root ::= "yes" | "no"\n')
    monkeypatch.chdir(tmp_path)
    assert command_line(**{"answer.grammar": "yn.gbnf"}).grammar == 'root ::= "yes" | "no"\n'
    with pytest.raises(ggbatch.GgbatchError, match=r"answer.grammar: no such file .*, got 'ny.gbnf'"):
        command_line(**{"answer.grammar": "ny.gbnf"})
    # in a job file, beside the job file
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "ab.gbnf").write_text('root ::= "a" | "b"\n')
    path = job(tmp_path / "jobs", "answer:\n  grammar: ab.gbnf\n")
    monkeypatch.chdir(ROOT)
    assert ggbatch.build_config([(path, ggbatch.load_job_file(path))]).grammar == 'root ::= "a" | "b"\n'


def test_a_grammar_without_a_root_rule_says_so():
    with pytest.raises(ggbatch.GgbatchError, match=r"answer.grammar: has no `root` rule"):
        command_line(**{"answer.grammar": 'answer ::= "yes" | "no"'})
    assert command_line(**{"answer.grammar": 'root ::= yn\nyn ::= "y" | "n"'}).grammar


@pytest.mark.parametrize("value", ["true", "[1, 2]", "null"])
def test_a_json_schema_flag_that_is_json_but_no_schema_says_what_is_expected(value):
    with pytest.raises(ggbatch.GgbatchError) as err:
        command_line(**{"answer.json_schema": value})
    assert "must be a JSON Schema object" in str(err.value) and "cannot read" not in str(err.value)


def test_a_json_schema_file_that_is_missing_says_no_such_file():
    with pytest.raises(ggbatch.GgbatchError, match=r"no such file \(expected a JSON Schema object.*got 'p.json'"):
        command_line(**{"answer.json_schema": "p.json"})


@pytest.mark.model
@pytest.mark.timeout(120)
def test_run_score_quiet_prints_nothing(tmp_path, demo_model):
    questions = write_questions(tmp_path / "q.jsonl", 2, gold=True)
    r = subprocess.run(ggbatch_cmd("run", *flags(demo_model, questions, tmp_path / "a.jsonl", "--score", "-q")),
                       cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert r.returncode in (0, 1), r.stderr
    assert r.stdout == ""


@pytest.mark.model
@pytest.mark.timeout(60)
@pytest.mark.parametrize("output", ["-", "/dev/stdout"])
def test_answers_to_standard_output_are_refused_in_one_line(tmp_path, demo_model, output):
    """`--output -` wrote a file named '-' (and its journal); /dev/stdout failed on its folder."""
    questions = write_questions(tmp_path / "q.jsonl", 2)
    done = subprocess.run([str(c) for c in ggbatch_cmd("run", "--model", demo_model, "--input", questions,
                                                        "--output", output)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert done.returncode == 2 and "not to standard output" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "-").exists()
