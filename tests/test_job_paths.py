"""A job file's path keys read as the same flags are: `-` kept as written (standard input for
`input`, refused for the files written), `~` expanded, an empty value refused naming the key.
The real command on real files; nothing written where it is refused."""

from __future__ import annotations

import pytest

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
