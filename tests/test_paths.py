"""A job's files: refused before any work when two are one file, or an output is unwritable."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from ggbatch.runner.errors import ConfigError, OutputError
from ggbatch.runner.files.paths import check_writable, job_paths
from helpers import ggbatch as cli
from helpers import ggbatch_command

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def files(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"questionID": "a", "question": "Hi?"}\n')
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    j = tmp_path / "job.yaml"
    j.write_text("model: m.gguf\n")
    return {"input": str(q), "model": str(m), "job_file": str(j), "dir": tmp_path}


def paths(files, output, report=None, errors=None):
    return job_paths(files["input"], files["model"], str(output), str(report) if report else None,
                     files["job_file"], str(errors) if errors else None)


@pytest.mark.parametrize("output,report,message", [
    ("q.jsonl", None, "the answers file (output) and the question file (input) are the same file"),
    ("a.json", "a.json", "the report and the answers file (output) are the same file"),
    ("m.gguf", None, "the answers file (output) and the model are the same file"),
    ("job.yaml", None, "the answers file (output) and the job file are the same file"),
    ("a.json", "a.json.journal.jsonl", "the output's journal and the report are the same file"),
    ("a.json", "q.jsonl", "the report and the question file (input) are the same file"),
    ("b.json.journal.jsonl", None, "is the journal or lock of another output"),
    ("a.json", "b.json.lock", "is the journal or lock of another output"),
])
def test_two_roles_for_one_file_are_refused(files, output, report, message):
    d = files["dir"]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        paths(files, d / output, d / report if report else None)


def test_links_are_seen_through(files):
    d = files["dir"]
    os.symlink(d / "q.jsonl", d / "link.json")
    with pytest.raises(ConfigError, match="question file"):
        paths(files, d / "link.json")
    os.link(d / "q.jsonl", d / "hard.json")
    with pytest.raises(ConfigError, match="question file"):
        paths(files, d / "hard.json")


def test_an_existing_journal_under_another_name_is_refused(files):
    d = files["dir"]
    (d / "old.json").write_text('{"ggbatch_journal": 1, "fingerprint": {}}\n')
    with pytest.raises(ConfigError, match="journal or lock of another output"):
        paths(files, d / "old.json")


def test_an_output_symlink_is_followed_and_its_journal_sits_beside_the_real_file(files):
    d = files["dir"]
    (d / "real").mkdir()
    os.symlink(d / "real" / "answers.json", d / "answers.json")
    p = paths(files, d / "answers.json")
    assert p.output == str(d / "real" / "answers.json")
    assert p.journal == str(d / "real" / "answers.json.journal.jsonl")


def test_check_writable(tmp_path):
    check_writable(str(tmp_path / "a.json"), "the plot")
    assert os.listdir(tmp_path) == []  # the probe leaves nothing behind
    with pytest.raises(OutputError, match=re.escape(f"the folder of the plot, {tmp_path / 'missing'}, does not exist")):
        check_writable(str(tmp_path / "missing" / "a.json"), "the plot")
    with pytest.raises(OutputError, match="the plot is a directory"):
        check_writable(str(tmp_path), "the plot")
    (tmp_path / "q.jsonl").write_text("{}\n")
    with pytest.raises(OutputError, match=re.escape(f"the folder of the plot, {tmp_path / 'q.jsonl'}, is a file, "
                                                    "not a folder")):
        check_writable(str(tmp_path / "q.jsonl" / "a.json"), "the plot")
    with pytest.raises(OutputError, match=re.escape(f"{tmp_path / 'q.jsonl' / 'x'}, does not exist: "
                                                    f"{tmp_path / 'q.jsonl'} is a file, not a folder")):
        check_writable(str(tmp_path / "q.jsonl" / "x" / "a.json"), "the plot")


def test_a_full_disk_is_refused_before_any_work(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with open(full / "filler", "wb") as f:
            try:
                f.write(b"\0" * 70_000)
                f.flush()
            except OSError:
                pass
        with pytest.raises(OutputError, match="No space left on device"):
            check_writable(str(full / "a.json"), "the report")
    finally:
        subprocess.run(["umount", str(full)])


def run(*args):
    return cli("run", *args, timeout=100)


@pytest.mark.model
@pytest.mark.parametrize("case", ["output=input", "report=output", "output=model"])
def test_the_cli_refuses_before_touching_anything(tmp_path, demo_model, case):
    q = tmp_path / "q.jsonl"
    q.write_text('{"questionID": "a", "question": "Hi?"}\n')
    out = tmp_path / "a.json"
    out.write_text("[]\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(open(demo_model, "rb").read())
    before = {p: p.read_bytes() for p in (q, out, model)}
    args = {"output=input": ["--output", q],
            "report=output": ["--output", out, "--report", out],
            "output=model": ["--output", model]}[case]
    r = run("--model", model, "--input", q, *args)
    assert r.returncode == 2, r.stderr
    assert "are the same file" in r.stderr and "Traceback" not in r.stderr
    assert {p: p.read_bytes() for p in before} == before
    assert not list(tmp_path.glob("*.journal.jsonl")) and not list(tmp_path.glob("*.lock"))


@pytest.mark.model
def test_answers_go_through_an_output_symlink(tmp_path, demo_model):
    q = tmp_path / "q.jsonl"
    q.write_text('{"questionID": "a", "question": "Once upon a time"}\n')
    (tmp_path / "real").mkdir()
    link = tmp_path / "answers.json"
    os.symlink(tmp_path / "real" / "answers.json", link)
    r = run("--model", demo_model, "--input", q, "--output", link, "--max-tokens", 4)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink()
    assert json.loads((tmp_path / "real" / "answers.json").read_text())[0]["questionID"] == "a"
    assert (tmp_path / "real" / "answers.json.journal.jsonl").exists()


@pytest.mark.parametrize("errors,message", [
    ("a.json", "the errors file (errors_output) and the answers file (output) are the same file"),
    ("q.jsonl", "the errors file (errors_output) and the question file (input) are the same file"),
    ("a.json.lock", "the output's lock and the errors file (errors_output) are the same file"),
])
def test_the_errors_file_is_a_file_of_its_own(files, errors, message):
    d = files["dir"]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        paths(files, d / "a.json", errors=d / errors)
    assert paths(files, d / "a.json", errors=d / "failed.json").errors_output == str(d / "failed.json")


def _answers_and_gold(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"questionID": "a", "question": "Hi?", "answer": "1"}\n')
    answers = tmp_path / "a.jsonl"
    answers.write_text('{"questionID": "a", "answer": "1"}\n')
    return gold, answers


def _writing_to(command, stream, tmp_path, model):
    """The command line of `command` writing its file to `stream`."""
    gold, answers = _answers_and_gold(tmp_path)
    return {"run": ["run", "--model", model, "--input", gold, "--max-tokens", 2, "--workers", 1, "--output", stream],
            "score": ["score", "--answers", answers, "--gold", gold, "--json", stream],
            "details": ["score", "--answers", answers, "--gold", gold, "--details", stream],
            "merge": ["merge", "--output", stream, answers]}[command]


@pytest.mark.model
@pytest.mark.parametrize("command", ["run", "score", "details", "merge"])
@pytest.mark.parametrize("stream", ["/dev/stdout", "/dev/stderr", "/dev/fd/1", "/proc/self/fd/1"])
def test_a_descriptor_name_is_refused_though_it_points_at_a_log_file(tmp_path, demo_model, command, stream):
    """`ggbatch ... --output /dev/stdout >> cron.log 2>&1`: following the link, the answers were
    renamed over the log (its lines lost, a journal beside it)."""
    log = tmp_path / "cron.log"
    log.write_text("OLD LOG LINE\n")
    with open(log, "a") as appended:
        done = subprocess.run(ggbatch_command(*_writing_to(command, stream, tmp_path, demo_model)), stdout=appended,
                              stderr=appended, timeout=100)
    text = log.read_text()
    assert done.returncode == 2 and text.startswith("OLD LOG LINE\n"), text
    # each command names its own file; only a run's answers have a journal to speak of
    written = {"run": "its files whole at the end", "score": "the score's --json file whole",
               "details": "the score's --details file whole", "merge": "the merged output whole"}[command]
    assert f"{stream}: ggbatch writes {written}, renamed into place" in text and "not to standard output" in text
    assert ("journal" in text) == (command == "run"), text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "cron.log", "gold.jsonl"]


@pytest.mark.parametrize("command", ["score", "details", "merge"])
def test_a_pipe_given_to_score_or_merge_is_refused_as_run_refuses_it(tmp_path, command):
    done = cli(*_writing_to(command, "/dev/stdout", tmp_path, "m.gguf"), timeout=100)
    assert done.returncode == 2 and "not to standard output, a pipe or a device" in done.stderr, done.stderr
    assert "not writable" not in done.stderr


@pytest.mark.parametrize("role", ["output", "report", "errors"])
def test_a_folder_given_as_an_output_is_named_by_its_role(files, role):
    d = files["dir"]
    (d / "adir").mkdir()
    given = {"output": d / "adir", "report": None, "errors": None, role: d / "adir"}
    said = {"output": "the answers file (output)", "report": "the report", "errors": "the errors file (errors_output)"}
    with pytest.raises(OutputError, match=re.escape(f"{d / 'adir'}: {said[role]} is a directory, not a file")):
        paths(files, d / "a.json" if role != "output" else given["output"], given["report"], given["errors"])


@pytest.mark.parametrize("role", ["output", "report", "errors"])
def test_a_missing_folder_for_an_output_is_named_with_its_role(files, role):
    d = files["dir"]
    missing = d / "nodir" / "x.json"
    given = {"output": d / "a.json", "report": None, "errors": None, role: missing}
    said = {"output": "the answers file (output)", "report": "the report", "errors": "the errors file (errors_output)"}
    with pytest.raises(OutputError, match=re.escape(f"{missing}: the folder of {said[role]}, {d / 'nodir'}, does "
                                                    "not exist")):
        paths(files, given["output"], given["report"], given["errors"])


@pytest.mark.model
@pytest.mark.parametrize("command,role", [("run", "the report"), ("score", "the score's --json file"),
                                          ("details", "the score's --details file"), ("merge", "the merged output")])
def test_every_command_names_the_file_whose_folder_is_missing(tmp_path, demo_model, command, role):
    missing = tmp_path / "nodir" / "r.json"
    line = _writing_to(command, missing, tmp_path, demo_model)
    if command == "run":  # the report, beside an answers file that can be written
        line = [*line[:-1], tmp_path / "a.json", "--report", missing]
    done = cli(*line, timeout=100)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"ggbatch: error: {missing}: the folder of {role}, "
                                                f"{tmp_path / 'nodir'}, does not exist"]


@pytest.mark.parametrize("role", ["the plot", "the bench table (--json)", "the merged output"])
def test_a_path_ending_in_a_separator_is_refused_as_a_folders_name(tmp_path, role):
    """`-o pl/` wrote a file named pl, and said it wrote pl/."""
    with pytest.raises(OutputError, match=re.escape(f"{tmp_path}/pl/: {role} is a folder's name (it ends in /); "
                                                    "give a file's path")):
        check_writable(f"{tmp_path}/pl/", role)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.model
@pytest.mark.parametrize("flags,said", [
    (["run", "--output", "ansd/"], "ansd/: the answers file (output)"),
    (["run", "--output", "a.jsonl", "--report", "rp/"], "rp/: the report"),
    (["bench", "--npl", "1", "--no-runner", "--plot", "bd/"], "bd/: the plot (--plot)")])
def test_an_output_ending_in_a_separator_is_refused_naming_its_role(tmp_path, stories, flags, said):
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n')
    given = [*flags, "--model", stories] + (["--input", "q.jsonl", "--max-tokens", "2"] if flags[0] == "run" else [])
    done = subprocess.run(ggbatch_command(*given), cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 2 and "PP" not in done.stdout, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [f"ggbatch: error: {said} is a folder's name (it ends in /); "
                                                "give a file's path"], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"]


def test_a_file_not_found_names_the_closest_name_in_its_folder(tmp_path, demo_model):
    """A quantization or an extension mistyped was 'model file not found' and no more: the name in
    the folder closest to the one given is offered, or that the folder itself does not exist."""
    (tmp_path / "qwen2.5-0.5b-instruct-q4_k_m.gguf").write_bytes(b"GGUF")
    (tmp_path / "questions.jsonl").write_text("")
    (tmp_path / "job.yaml").write_text("")
    for args, said in (
            (["--model", "qwen2.5-0.5b-instruct-q4_k.gguf", "--input", "questions.jsonl", "--output", "a.jsonl"],
             "qwen2.5-0.5b-instruct-q4_k.gguf: model file not found; did you mean qwen2.5-0.5b-instruct-q4_k_m.gguf?"),
            (["--model", demo_model, "--input", "question.jsonl", "--output", "a.jsonl"],
             "question.jsonl: input file not found; did you mean questions.jsonl?"),
            (["job.yml"], "job.yml: job file not found; did you mean job.yaml?"),
            (["--model", "models/m.gguf", "--input", "questions.jsonl", "--output", "a.jsonl"],
             "models/m.gguf: model file not found"),
            (["--model", "zzz.gguf", "--input", "questions.jsonl", "--output", "a.jsonl"],
             "zzz.gguf: model file not found")):
        r = subprocess.run(ggbatch_command("run", *args), capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert r.returncode == 2 and r.stderr == f"ggbatch: error: {said}\n", r.stderr


def test_a_folder_given_as_the_model_or_the_questions_names_the_files_it_holds(tmp_path, demo_model):
    """A model's or a dataset's folder was 'is a directory, not a file' and no more: the GGUF or
    question files in it are named, and a Hugging Face dataset saved with save_to_disk is said."""
    models, questions, saved = tmp_path / "models", tmp_path / "questions", tmp_path / "saved"
    for folder in (models, questions, saved):
        folder.mkdir()
    (models / "m-q8_0.gguf").write_bytes(b"GGUF")
    for name in ("a.jsonl", "b.csv", "notes.txt"):
        (questions / name).write_text("")
    for name in ("state.json", "dataset_info.json", "data-00000-of-00001.arrow"):
        (saved / name).write_text("")
    for args, said in (
            (["--model", "models", "--input", "q.jsonl"],
             "models: model path is a directory, not a GGUF file (give the file it holds: models/m-q8_0.gguf)"),
            (["--model", demo_model, "--input", "questions"],
             "questions: input is a directory, not a file (it holds a.jsonl and b.csv: give one of them)"),
            (["--model", demo_model, "--input", "saved"],
             "saved: input is a directory, not a file (a Hugging Face dataset saved with save_to_disk: write it "
             "as JSON Lines, datasets.load_from_disk('saved').to_json('questions.jsonl'))")):
        r = subprocess.run(ggbatch_command("run", *args, "--output", "a.jsonl"), capture_output=True, text=True,
                           cwd=tmp_path, timeout=60)
        assert r.returncode == 2 and r.stderr == f"ggbatch: error: {said}\n", r.stderr
