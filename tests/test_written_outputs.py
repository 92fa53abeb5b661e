"""ggbatch writes text: an output named for another format, or an existing file that is no text,
is refused before any work (an answers file named .parquet held JSON, exit 0; `--output` naming
a model overwrote the model with the answers)."""

from __future__ import annotations

import json
import zipfile

import pytest

from ggbatch.runner.errors import ConfigError
from ggbatch.runner.files.paths import job_paths
from helpers import ggbatch

pytestmark = pytest.mark.timeout(120)

ROLES = {"output": "the answers file (output)", "report": "the report",
         "errors_output": "the errors file (errors_output)"}


@pytest.fixture
def files(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"questionID": "a", "question": "Hi?"}\n')
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF" + bytes(60))
    return {"input_path": str(q), "model": str(m), "output": str(tmp_path / "a.jsonl")}


@pytest.mark.parametrize("key", sorted(ROLES))
@pytest.mark.parametrize("name,then", [
    ("a.parquet", "; pandas makes the .parquet file from the lines: pd.read_json('a.jsonl', lines=True)"
                  ".to_parquet('a.parquet')"),
    ("a.XLSX", "; pandas makes the .xlsx file from the lines: pd.read_json('a.jsonl', lines=True).to_excel('a.XLSX')"),
    ("a.gguf", ""),
    ("a.csv.gz", ""),
])
def test_a_file_named_for_a_format_ggbatch_does_not_write_is_refused(tmp_path, files, key, name, then):
    path = tmp_path / name
    with pytest.raises(ConfigError) as err:
        job_paths(**{**files, key: str(path)})
    suffix = path.suffix.lower()
    assert str(err.value) == (f"{path}: {ROLES[key]} would be text under a {suffix} name: ggbatch writes JSON, "
                              f"JSON Lines or CSV; name it .jsonl, .json or .csv{then}")
    assert not path.exists()


@pytest.mark.parametrize("key", sorted(ROLES))
def test_a_file_that_is_no_text_is_not_written_over(tmp_path, files, key):
    model = tmp_path / "copy.bin"  # a model under a name that says nothing
    model.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(600))
    workbook = tmp_path / "sheet.json"  # an Excel workbook saved under the name a pipeline expected
    with zipfile.ZipFile(workbook, "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    for path, kind in ((model, "a GGUF model"), (workbook, "a spreadsheet workbook (Excel or OpenDocument)")):
        before = path.read_bytes()
        with pytest.raises(ConfigError) as err:
            job_paths(**{**files, key: str(path)})
        assert str(err.value) == f"{path}: {ROLES[key]} would replace this file, {kind}; give another path"
        assert path.read_bytes() == before


def test_text_files_are_written_over_as_before(tmp_path, files):
    """A rerun writes over its answers; an empty file, or one of another run, is text too."""
    for name, text in (("a.json", '[{"questionID": "a", "answer": "4"}]'), ("a.csv", "questionID,answer\n"),
                       ("a.out", ""), ("a.txt", "notes, in UTF-8: ünïcödé\n")):
        (tmp_path / name).write_text(text)
        assert job_paths(**{**files, "output": str(tmp_path / name)}).output == str(tmp_path / name)


def test_the_commands_refuse_it_too(tmp_path, files):
    """`ggbatch run --output model.gguf` (the flags swapped) overwrote the model with the answers;
    merge's and score's outputs are refused alike."""
    model = tmp_path / "other.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(600))
    run = ggbatch("run", "--model", "demo", "--input", files["input_path"], "--output", model, "-q", timeout=100)
    assert (run.returncode, run.stderr) == (2, f"ggbatch: error: {model}: the answers file (output) would be text "
                                               "under a .gguf name: ggbatch writes JSON, JSON Lines or CSV; name it "
                                               ".jsonl, .json or .csv\n")
    assert model.read_bytes()[:4] == b"GGUF"
    part = tmp_path / "part.jsonl"
    part.write_text(json.dumps({"questionID": "a", "answer": "4"}) + "\n")
    merged = ggbatch("merge", part, "--output", tmp_path / "all.parquet", timeout=100)
    assert merged.returncode == 2 and "the merged output would be text under a .parquet name" in merged.stderr
    scored = ggbatch("score", "--answers", part, "--gold", part, "--json", tmp_path / "s.xlsx", timeout=100)
    assert scored.returncode == 2 and "the score's --json file would be text under a .xlsx name" in scored.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "other.gguf", "part.jsonl", "q.jsonl"]
