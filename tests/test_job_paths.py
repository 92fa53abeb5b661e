"""A job file's path keys read as the same flags are: `-` kept as written (standard input for
`input`, refused for the files written), `~` expanded, an empty value refused naming the key.
The real command on real files; nothing written where it is refused."""

from __future__ import annotations

import json
import os

import pytest

from conftest import ROOT
from helpers import ggbatch

pytestmark = [pytest.mark.timeout(180), pytest.mark.model]

STREAM = "ggbatch writes its files whole at the end, renamed into place"


def _job(folder, text):
    folder.mkdir(exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key", ["output", "report", "errors_output"])
def test_a_dash_for_a_file_written_is_refused_as_the_flag_is(tmp_path, demo_model, key):
    """`output: "-"` wrote a file named `-` into the job's folder, exit 0, where `--output -` is refused."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n')
    files = {"output": str(tmp_path / "a.json"), key: "-"}
    sub = tmp_path / "sub"
    job = _job(sub, f"model: {demo_model}\ninput: {tmp_path / 'q.jsonl'}\nmax_tokens: 2\n"
                    + "".join(f'{k}: "{v}"\n' for k, v in files.items()))
    done = ggbatch("run", job, "-q", timeout=150)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"ggbatch: error: -: {STREAM} (a run's answers with a journal beside them that a rerun " \
                          "goes on from), not to standard output, a pipe or a device: give a file's path\n"
    assert sorted(p.name for p in sub.iterdir()) == ["job.yaml"] and not (tmp_path / "a.json").exists()
    flag = ggbatch("run", "--model", demo_model, "--input", tmp_path / "q.jsonl", "--output", files["output"],
                   f"--{key.replace('_', '-')}", "-", "-q", timeout=150)
    assert (flag.returncode, flag.stderr) == (2, done.stderr)


def test_a_tilde_is_the_home_folder_for_every_path_key_of_a_job_file_and_of_a_flag(tmp_path, demo_model):
    """`input: ~/q.jsonl` was left as written and not found ('~/q.jsonl: input file not found'), and
    `output: ~/out.json` was read relative to the current folder, where the model's `~` was expanded."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n')
    (home / "m.gguf").symlink_to(demo_model)
    job = _job(tmp_path / "sub", "model: ~/m.gguf\ninput: ~/q.jsonl\noutput: ~/a.json\nreport: ~/r.json\n"
                                 "errors_output: ~/e.json\nmax_tokens: 2\n")
    env = {**os.environ, "HOME": str(home)}
    done = ggbatch("run", job, "-q", env=env, timeout=150)
    assert done.returncode == 0, done.stderr
    assert json.loads((home / "a.json").read_text())[0]["questionID"] == "a"
    assert json.loads((home / "r.json").read_text())["questions"]["answered"] == 1
    assert (home / "e.json").exists() and sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["job.yaml"]
    flags = ggbatch("run", "--model=~/m.gguf", "--input=~/q.jsonl", "--output=~/b.json", "--report=~/r2.json",
                    "--max-tokens", "2", "-q", env=env, timeout=150)  # `=`: the shell expands no `~` there
    assert flags.returncode == 0, flags.stderr
    assert json.loads((home / "b.json").read_text()) == json.loads((home / "a.json").read_text())
    assert (home / "r2.json").exists() and not (ROOT / "~").exists()


@pytest.mark.parametrize("key", ["report", "errors_output", "output", "model"])
def test_an_empty_path_is_refused_naming_the_key_in_a_job_file_and_as_a_flag(tmp_path, demo_model, key):
    """`--report ''` and `--errors-output ''` were taken and no file written, exit 0; in a job file
    `report: ""` became the job's folder, refused as 'the report is a directory', a path never written."""
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n')
    keys = {"model": demo_model, "input": str(tmp_path / "q.jsonl"), "output": str(tmp_path / "a.json"), key: ""}
    job = _job(tmp_path / "sub", "".join(f'{k}: "{v}"\n' for k, v in keys.items()))
    done = ggbatch("run", job, "-q", timeout=150)
    assert (done.returncode, done.stderr) == (2, f"ggbatch: error: {job}: {key}: must be a non-empty string, got ''\n")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in keys.items()]
    flag = ggbatch("run", *flags, "-q", timeout=150)
    assert (flag.returncode, flag.stderr) == (2, f"ggbatch: error: command line: {key}: must be a non-empty string, "
                                                 "got ''\n")
    assert not (tmp_path / "a.json").exists()


def test_a_job_files_paths_read_the_environments_variables(tmp_path, demo_model):
    """`model: $MODELS/m.gguf` was a file not found in a folder named `$MODELS`, beside the job file,
    where the same path as a flag is the shell's to expand."""
    models, data = tmp_path / "models", tmp_path / "data"
    models.mkdir(), data.mkdir()
    (models / "m.gguf").symlink_to(demo_model)
    (data / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n')
    job = _job(tmp_path / "sub", "model: $MODELS/m.gguf\ninput: ${DATA}/q.jsonl\noutput: ${DATA}/a.json\n"
                                 "max_tokens: 2\n")
    env = {**os.environ, "MODELS": str(models), "DATA": str(data)}
    done = ggbatch("run", job, "-q", env=env, timeout=150)
    assert done.returncode == 0, done.stderr
    assert json.loads((data / "a.json").read_text())[0]["questionID"] == "a"
    del env["DATA"]
    unset = ggbatch("run", job, "-q", env=env, timeout=150)
    assert (unset.returncode, unset.stderr) == (2, f"ggbatch: error: {job}: input: ${{DATA}}/q.jsonl: the environment "
                                                   "has no variable DATA (set it, or write the path out)\n")
