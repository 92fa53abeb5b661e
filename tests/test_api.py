"""The Python API users see: `import ggbatch`, run a job, answer questions in memory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import ggbatch
from helpers import ROOT, ggbatch_command, wait_for, write_questions

pytestmark = [pytest.mark.timeout(180), pytest.mark.model]


def test_run_a_job_from_keyword_arguments_returns_the_report(tmp_path, demo_model, questions_file):
    out = tmp_path / "a.json"
    report = ggbatch.run(model=demo_model, input=questions_file(4), output=str(out), max_tokens=8, workers=1,
                         sampling={"temperature": 0.0, "seed": 3})
    assert isinstance(report, ggbatch.RunReport)
    assert (report.answered, report.failed) == (4, 0)
    assert report.setup.config.sampling.seed == 3
    assert 0 < report.as_json()["tokens"]["generated"] <= 4 * 8
    assert [r["questionID"] for r in json.loads(out.read_text())] == [f"q{i}" for i in range(4)]


def test_run_a_job_file_with_overrides(tmp_path, demo_model, questions_file):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {demo_model}\ninput: {questions_file(3)}\noutput: a.jsonl\nmax_tokens: 64\n")
    report = ggbatch.run(str(job), max_tokens=4, sampling__seed=5)
    assert report.setup.config.max_tokens == 4 and report.setup.config.sampling.seed == 5
    assert (tmp_path / "a.jsonl").exists()  # the job file's relative path, from its own folder


def test_a_bad_setting_is_a_ggbatch_error_naming_it(demo_model):
    with pytest.raises(ggbatch.GgbatchError, match="unknown key 'max_tokenz'") as err:
        ggbatch.run(model=demo_model, input="q.jsonl", output="a.json", max_tokenz=3)
    assert err.value.exit_code == 2


def test_settings_that_do_not_hold_together_are_said_after_the_call_that_gave_them(demo_model):
    """A key's own error named the call (`ggbatch.answer(): max_tokens: ...`), and an error
    between keys did not: `sampling.n: 3 samples need sampling.temperature > 0`."""
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.answer\(\): sampling.n: 3 samples need sampling.temp"):
        ggbatch.answer(["x"], model=demo_model, sampling={"n": 3})
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.run\(\): answer.logprobs: needs answer.choices"):
        ggbatch.run(model=demo_model, input="q.jsonl", output="a.json", answer={"logprobs": True})


def test_a_missing_model_is_said_as_the_keyword_run_takes(tmp_path, questions_file):
    """It said 'give it in the job file or as --model', a flag ggbatch.run() has not."""
    with pytest.raises(ggbatch.GgbatchError) as err:
        ggbatch.run(input=questions_file(2), output=str(tmp_path / "a.json"))
    assert str(err.value) == "ggbatch.run(): missing required setting 'model' (give it in the job file or as model=)"
    assert err.value.exit_code == 2 and not (tmp_path / "a.json").exists()
    job = tmp_path / "job.yaml"
    job.write_text("max_tokens: 3\n")
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.run\(\): missing required setting 'output' \(give it "
                                                   f"in the job file {job} or as output=\\)$"):
        ggbatch.run(str(job), model="m.gguf", input="q.jsonl")


def test_the_models_own_keys_sit_beside_its_path(demo_model):
    """model="m.gguf" with model__n_ctx (Python's spelling of model.n_ctx, which lm-eval's
    --model_args passes as written) is a job file's model: {path: m.gguf, n_ctx: 512}, in either order."""
    from ggbatch.runner.config.keywords import job_config, settings_layer

    for settings in ({"model": demo_model, "model__n_ctx": 512}, {"model.n_ctx": 512, "model": demo_model},
                     {"model": demo_model, "model.n_ctx": 512}):
        config = job_config(input="q.jsonl", output="a.json", **settings)
        assert (config.model, config.n_ctx) == (demo_model, 512)
    # a key whose value is a mapping of its own is replaced, not merged: the later schema is the schema
    enum = {"type": "string", "enum": ["x", "y"]}
    layer = settings_layer({"answer": {"json_schema": {"type": "object", "required": ["a"]}},
                            "answer__json_schema": enum}, "ggbatch.run()")
    assert layer["answer.json_schema"] == enum
    with pytest.raises(ggbatch.GgbatchError, match="unknown key 'n_gpu_layers' .did you mean 'model__n_gpu_layers'"):
        job_config(model=demo_model, input="q.jsonl", output="a.json", n_gpu_layers="all")
    with pytest.raises(ggbatch.GgbatchError, match="sampling=0.5 is not a mapping, yet keys inside sampling"):
        job_config(model=demo_model, input="q.jsonl", output="a.json", sampling=0.5, sampling__seed=1)
    with pytest.raises(ggbatch.GgbatchError, match="unknown key 'temprature' .did you mean 'sampling__temperature'"):
        job_config(model=demo_model, input="q.jsonl", output="a.json", temprature=0.5)
    with pytest.raises(ggbatch.GgbatchError, match="unknown key 'max_tokens__x': max_tokens holds no keys"):
        job_config(model=demo_model, input="q.jsonl", output="a.json", max_tokens=5, max_tokens__x=1)


def test_answer_questions_in_memory_in_their_order(tmp_path, demo_model):
    questions = ["Once upon a time", "The little dog", {"question": "Tom and Sue went", "hint": "park"}]
    answers = ggbatch.answer(questions, model=demo_model, max_tokens=8)
    assert [a.id for a in answers] == ["0", "1", "2"]
    assert all(a.text and a.error is None for a in answers)
    # the same engine as a job: identical to answering the same prompts through a file
    again = ggbatch.answer(questions[:2], model=demo_model, max_tokens=8)
    assert [a.text for a in again] == [a.text for a in answers[:2]]


def test_answer_can_keep_its_files_to_resume(tmp_path, demo_model):
    folder = tmp_path / "work"
    first = ggbatch.answer(["Once upon a time"], model=demo_model, max_tokens=6, resume_dir=str(folder))
    assert (folder / "answers.jsonl.journal.jsonl").exists()
    second = ggbatch.answer(["Once upon a time", "The cat"], model=demo_model, max_tokens=6, resume_dir=str(folder),
                            report=str(tmp_path / "r.json"))
    assert second[0].text == first[0].text and second[1].text
    assert json.loads((tmp_path / "r.json").read_text())["questions"]["records"] == 2  # the report asked for


def test_answer_refuses_a_report_it_would_not_write(tmp_path, demo_model):
    """answer(report=) without resume_dir was taken, and no file written: no word of it."""
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.answer\(\): report= is written only with resume_dir="):
        ggbatch.answer(["Once upon a time"], model=demo_model, max_tokens=4, report=str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json").exists()


def test_a_changed_setting_is_refused_in_the_callers_own_terms(tmp_path, demo_model, questions_file):
    job = {"model": demo_model, "input": questions_file(2), "output": str(tmp_path / "a.json"), "workers": 1}
    ggbatch.run(**job, max_tokens=4)
    with pytest.raises(ggbatch.GgbatchError) as err:
        ggbatch.run(**job, max_tokens=6)
    assert str(err.value).endswith("'max_tokens' changed since the journaled run (4 -> 6); pass fresh=True to "
                                   "start over")
    assert ggbatch.run(**job, max_tokens=6, fresh=True).answered == 2  # what the message says works
    # answer() has no fresh=: its journal is resume_dir's
    folder = str(tmp_path / "work")
    ggbatch.answer(["Once upon a time"], model=demo_model, max_tokens=4, resume_dir=folder)
    with pytest.raises(ggbatch.GgbatchError, match=r"\(4 -> 6\); use another resume_dir \(or empty this one\) to "
                                                   "start over$"):
        ggbatch.answer(["Once upon a time"], model=demo_model, max_tokens=6, resume_dir=folder)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_python_snippets_of_the_readme_and_the_api_page_run_after_the_quick_start(tmp_path):
    """The README's quick start runs jobs/example.yaml (max_tokens 48); the README's "From Python"
    block and every block of docs/guide/python-api.md, run next in the same folder, run (the same
    job with max_tokens 64, the demo model, build_config's layers)."""
    (tmp_path / "jobs").mkdir()
    for name in ("example.yaml", "example-questions.jsonl"):
        shutil.copy(ROOT / "jobs" / name, tmp_path / "jobs" / name)
    quick = subprocess.run(ggbatch_command("run", "jobs/example.yaml", "-q"), cwd=tmp_path, capture_output=True,
                           text=True, timeout=140)
    assert quick.returncode == 0, quick.stderr
    readme = (ROOT / "README.md").read_text(encoding="utf-8").split("## From Python")[1].split("\n## ")[0]
    page = (ROOT / "docs" / "guide" / "python-api.md").read_text(encoding="utf-8")
    blocks = python_blocks(readme) + python_blocks(page)
    assert len(blocks) == 3
    for block in blocks:
        (tmp_path / "snippet.py").write_text(block)
        done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=140)
        assert done.returncode == 0, block + done.stderr
        if block is blocks[0]:  # the README's run writes a report of its own: the quick start's stays
            reports = {n: json.loads((tmp_path / n).read_text())["generation"]["max_tokens"]
                       for n in ("jobs/example-report.json", "example-report-64.json")}
            assert reports == {"jobs/example-report.json": 48, "example-report-64.json": 64}
    assert done.stdout.split() == ["16", "12"]  # build_config's layers: the later one's max_tokens


@pytest.mark.parametrize("call", ["ggbatch.answer(['2+2?'], model=MODEL, max_tokens=2)",
                                  "ggbatch.Pool(model=MODEL, max_tokens=2).close()",
                                  "ggbatch.run(model=MODEL, input='q.jsonl', output='a.jsonl', max_tokens=2)"])
def test_a_script_starting_ggbatch_without_the_main_guard_is_told_so(tmp_path, demo_model, call):
    """Spawned processes import the script again: without `if __name__ == "__main__":` each
    child would start ggbatch anew. The error says so, not that a process died loading the model,
    and it is the last line: the child leaves before it makes a lock, which the resource tracker
    would report as leaked semaphores after it."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "1", "question": "2+2?"}\n')
    (tmp_path / "script.py").write_text(f"import ggbatch\nMODEL = {demo_model!r}\n{call}\n")
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ggbatch.runner.errors.ConfigError: the script starts ggbatch when it is imported")
    assert 'if __name__ == \"__main__\":' in last, done.stderr
    assert "died" not in done.stderr and "bootstrapping phase" not in done.stderr, done.stderr


@pytest.mark.timeout(200)
@pytest.mark.parametrize("call", ["print(ggbatch.answer(['2+2?'], model=MODEL, max_tokens=2)[0].error)",
                                  "ggbatch.Pool(model=MODEL, max_tokens=2).close()",
                                  "ggbatch.run(model=MODEL, input='q.jsonl', output='a.jsonl', max_tokens=2)"])
def test_a_script_python_reads_from_standard_input_starts_ggbatch(tmp_path, demo_model, call):
    """`python - <<EOF` (a shell script's, a pipe's): the script has no file a spawned child could
    run again, and needs no main guard. Each child failed running "<stdin>", reported as a
    tokenizer that died loading the vocabulary."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "1", "question": "2+2?"}\n')
    script = f"import ggbatch\nMODEL = {demo_model!r}\n{call}\nprint('done')\n"
    done = subprocess.run([sys.executable, "-"], input=script, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == (["None", "done"] if "answer(" in call else ["done"]), done.stdout  # no error
    if "run(" in call:
        assert json.loads((tmp_path / "a.jsonl").read_text())["questionID"] == "1"


CHILD_ONLY = ("OPENBLAS_NUM_THREADS", "GGML_NO_BACKTRACE")
CHILDREN_ENVIRONMENTS = f"""
import json, os, psutil, ggbatch
if __name__ == "__main__":
    with ggbatch.Pool(model=MODEL, max_tokens=2) as pool:
        pool.answer(["hi"])
        children = [{{n: p.environ().get(n) for n in {CHILD_ONLY}}} for p in psutil.Process().children()
                    if "resource_tracker" not in " ".join(p.cmdline())]  # multiprocess's, not ggbatch's
    print(json.dumps({{"own": {{n: os.environ.get(n) for n in {CHILD_ONLY}}}, "children": children}}))
"""


def test_the_childrens_environment_is_theirs_not_the_callers(tmp_path, demo_model):
    """OPENBLAS_NUM_THREADS=1, set in the caller's process when ggbatch was imported, made the
    caller's own numpy, imported after ggbatch, compute on one thread. The workers and the
    tokenizer still start with it and GGML_NO_BACKTRACE."""
    (tmp_path / "script.py").write_text(f"MODEL = {demo_model!r}\n{CHILDREN_ENVIRONMENTS}")
    env = {name: value for name, value in os.environ.items() if name not in CHILD_ONLY}
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["own"] == dict.fromkeys(CHILD_ONLY), seen
    assert seen["children"] == [dict.fromkeys(CHILD_ONLY, "1")] * 2, seen  # a worker and the tokenizer


def python_blocks(markdown: str) -> list[str]:
    return [part.split("```")[0] for part in markdown.split("```python\n")[1:]]


STOPPED = """
import signal, sys, ggbatch
if __name__ == "__main__":
    how, sig = sys.argv[1], sys.argv[2]
    # Ctrl-C as a terminal's program gets it, or ignored as a shell's background job starts
    # (whatever this test's runner was started with)
    signal.signal(signal.SIGINT, signal.SIG_IGN if sig == "ignored" else signal.default_int_handler)
    settings = dict(model={model!r}, max_tokens=2000, ignore_eos=True, workers=1, threads=1)
    try:
        if how == "run":
            ggbatch.run(input="q.jsonl", output="a.jsonl", progress="off", **settings)
        else:
            rows = ggbatch.answer([f"Once upon a time {{i}}" for i in range({n})], resume_dir="rd", **settings)
            print("answered", sum(a.error is None for a in rows))
    except KeyboardInterrupt:
        if how == "run":
            raise  # uncaught, as most scripts leave it
        print("caught KeyboardInterrupt")
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how, sig, n, code, last", [
    ("answer", "SIGINT", 64, 0, "caught KeyboardInterrupt"),  # except KeyboardInterrupt catches Ctrl-C
    ("run", "SIGINT", 64, -signal.SIGINT, ""),  # uncaught: Python's exit by SIGINT (130), not 1
    ("answer", "SIGTERM", 64, -signal.SIGTERM, ""),  # SIGTERM's own end (143)
    ("answer", "ignored", 8, 0, "answered 8"),  # SIGINT ignored at the call stays ignored
])
def test_a_signal_stopping_a_job_from_python_goes_on_as_the_signal_does(tmp_path, demo_model, how, sig, n, code,
                                                                         last):
    """ggbatch.run() and answer(resume_dir=) raised Interrupted (exit 1, "failed" to cron and
    Slurm) where a plain answer() is ended by the signal itself, and took SIGINT even where the
    script ignored it. The answers file is written first, whatever comes after."""
    write_questions(tmp_path / "q.jsonl", n)
    (tmp_path / "script.py").write_text(STOPPED.format(model=demo_model, n=n))
    proc = subprocess.Popen([sys.executable, "script.py", how, sig], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    journal = tmp_path / ("a.jsonl.journal.jsonl" if how == "run" else "rd/answers.jsonl.journal.jsonl")
    wait_for(journal.exists, 120, "the run's journal")
    time.sleep(1.5)  # the run under way: each question takes far longer
    proc.send_signal(signal.SIGTERM if sig == "SIGTERM" else signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code and out.strip().endswith(last), err
    assert "errors.Interrupted" not in err and "leaked" not in err, err
    written = tmp_path / ("a.jsonl" if how == "run" else "rd/answers.jsonl")
    assert len(written.read_text().splitlines()) == n


@pytest.mark.timeout(120)
def test_settings_checked_as_they_are_used_name_the_job_file_and_the_callers_mistakes_are_said(demo_model,
                                                                                                 tmp_path):
    """A job file's schema, grammar or template refused as it was used named the key alone
    (`ggbatch: error: answer.json_schema: ...`, job-files.md: every error names the file and the
    key); answer(resume_dir=5) was Python's TypeError from deep inside; a record without an id
    was blamed as a duplicate of the id another one gave, its index."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi"}\n')
    job = tmp_path / "job.yaml"
    for text, said in [("answer:\n  json_schema: {type: nonsense}\n", "answer.json_schema: cannot turn"),
                       ("answer:\n  grammar: 'root ::= ('\n", "answer.grammar: not a grammar"),
                       ("prompt:\n  template: '{{ nope'\n", "prompt.template: line 1: ")]:
        job.write_text(f"model: {demo_model}\ninput: q.jsonl\noutput: a.json\nworkers: 1\n{text}")
        with pytest.raises(ggbatch.GgbatchError) as err:
            ggbatch.run(str(job), progress="off")
        assert str(err.value).startswith(f"{job}: {said}"), str(err.value)
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.answer\(\): resume_dir: must be a folder's path"):
        ggbatch.answer(["x"], model=demo_model, resume_dir=5)
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.answer\(\): questions\[0\] has no questionID, so "):
        ggbatch.answer(["x", {"questionID": "0", "question": "y"}], model=demo_model, resume_dir=str(tmp_path / "r"))


@pytest.mark.timeout(120)
def test_a_chat_template_that_does_not_parse_is_said_as_its_key_after_the_file_or_call(demo_model, tmp_path):
    """prompt.chat_template's syntax error said only `chat template: line 1: ...`: no job file, no
    key, no call, where prompt.template's says `job.yaml: prompt.template: line 1: ...`."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {demo_model}\ninput: q.jsonl\noutput: a.json\nworkers: 1\n"
                   "prompt:\n  chat_template: '{% if %}'\n")
    said = "prompt.chat_template: line 1: "
    for call, where in [(lambda: ggbatch.run(str(job), progress="off"), f"{job}: "),
                        (lambda: ggbatch.Pool(model=demo_model, workers=1, prompt={"chat_template": "{% if %}"}),
                         "ggbatch.Pool(): "),
                        (lambda: ggbatch.answer(["a"], model=demo_model, prompt__chat_template="{% if %}"),
                         "ggbatch.answer(): ")]:
        with pytest.raises(ggbatch.GgbatchError) as err:
            call()
        assert str(err.value).startswith(where + said), str(err.value)


@pytest.mark.timeout(120)
def test_a_keywords_schema_grammar_or_template_refused_as_used_names_run_or_answer(demo_model, tmp_path):
    """ggbatch.run(answer__grammar=...) said `answer.grammar: ...` without the call, while its
    max_tokens=-1 said `ggbatch.run(): max_tokens: ...`; so did answer(resume_dir=), a job too."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {demo_model}\ninput: q.jsonl\noutput: a.json\nworkers: 1\n"
                   "answer:\n  grammar: 'root ::= \"a\"'\n")
    files = dict(model=demo_model, input=str(tmp_path / "q.jsonl"), output=str(tmp_path / "a.json"), workers=1)
    calls = [(lambda: ggbatch.run(**files, answer={"json_schema": {"type": "nonsense"}}),
              "ggbatch.run(): answer.json_schema: cannot turn"),
             (lambda: ggbatch.run(**files, prompt__template="{% if %}"), "ggbatch.run(): prompt.template: line 1: "),
             (lambda: ggbatch.run(str(job), answer__grammar="root ::= ("),  # the keyword overrides the file's
              "ggbatch.run(): answer.grammar: not a grammar"),
             (lambda: ggbatch.answer(["a"], model=demo_model, resume_dir=str(tmp_path / "r"),
                                     answer__grammar="root ::= ("),
              "ggbatch.answer(): answer.grammar: not a grammar")]
    for call, said in calls:
        with pytest.raises(ggbatch.GgbatchError) as err:
            call()
        assert str(err.value).startswith(said), str(err.value)


@pytest.mark.timeout(120)
def test_questions_mixing_records_with_and_without_ids_are_refused_whatever_the_ids(demo_model):
    """A record without an id took its index as its id: a mix was refused when that index was
    another record's id and answered otherwise ([{'questionID': '5', ...}, {...}] gave ids '5' and
    '1'). One rule now: every question its id, or none."""
    for questions in ([{"questionID": "5", "question": "a"}, {"question": "b"}],
                      [{"questionID": "1", "question": "a"}, {"question": "b"}],
                      ["a", {"questionID": "x", "question": "b"}]):
        with pytest.raises(ggbatch.GgbatchError) as err:
            ggbatch.answer(questions, model=demo_model, max_tokens=2, workers=1)
        said = str(err.value)
        assert said.startswith("ggbatch.answer(): questions["), said
        assert said.endswith("give every question its questionID, or none"), said


def test_a_data_frame_or_a_table_is_answered_by_its_rows(demo_model):
    """`ggbatch.answer(df)` answered a pandas DataFrame's column names, one question each, and gave
    their answers as the rows' (a polars one is iterated by its columns; a pyarrow Table cannot be)."""
    pd, pa = pytest.importorskip("pandas"), pytest.importorskip("pyarrow")
    records = [{"questionID": "a", "question": "Once upon a time", "who": "cat"},
               {"questionID": "b", "question": "The little dog", "who": "dog"}]
    settings = dict(model=demo_model, max_tokens=6, prompt={"template": "{{question}} and the {{who}}"})
    expected = [(a.id, a.text) for a in ggbatch.answer(records, **settings)]
    frame = pd.DataFrame(records)
    for table in (frame, frame.set_index("questionID"), pa.Table.from_pylist(records)):  # a named index is a field
        assert [(a.id, a.text) for a in ggbatch.answer(table, **settings)] == expected
    texts = pd.DataFrame({"question": ["Once upon a time", "The little dog", "Lily"]})
    assert [a.id for a in ggbatch.answer(texts, model=demo_model, max_tokens=2)] == ["0", "1", "2"]
    with ggbatch.Pool(model=demo_model, max_tokens=6, prompt={"template": "{{question}} and the {{who}}"}) as pool:
        assert [(a.id, a.text) for a in pool.answer(pd.DataFrame(records))] == expected
