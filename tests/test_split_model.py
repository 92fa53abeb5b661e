"""A split GGUF (NAME-00001-of-0000N.gguf, llama.cpp loads the other parts from beside the first)
is one model: its identity, its size and the files watched during a run are every part's
(runner/model/hub.py model_parts). They were the first part's alone: a changed second part left
the identity as it was, and a rerun reused the answers made with the other weights."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gguf
import pytest

from ggbatch.runner.errors import ModelError
from ggbatch.runner.model.hub import model_bytes, model_parts
from ggbatch.runner.model.identity import identify
from ggbatch.runner.model.make import modelgen as mg
from ggbatch.runner.pool.model_file import ModelFile
from ggbatch.workers.spec import WorkerSpec
from helpers import ggbatch

TENSORS_PER_PART = 8


def split(source: str, first: Path) -> list[Path]:
    """`source` rewritten as a split GGUF whose first part is `first` (gguf-py's writer, as
    llama.cpp's gguf-split writes one): its parts."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(first).replace("-00001-of-00003", ""), reader.fields["general.architecture"]
                             .contents(), split_max_tensors=TENSORS_PER_PART)
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(first.parent.glob("*.gguf"))


@pytest.fixture(scope="module")
def split_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the first part of the demo model split in 3, of another demo model of the same shape)."""
    made = []
    for seed in (0, 7):
        folder = tmp_path_factory.mktemp(f"split{seed}")
        whole = mg.make_model(folder / "whole" / "m.gguf", "demo", seed=seed, ftype="f32")
        first = folder / "m-00001-of-00003.gguf"
        assert [p.name for p in split(str(whole), first)] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
        made.append(first)
    return made[0], made[1]


@pytest.fixture
def model(tmp_path: Path, split_models: tuple[Path, Path]) -> Path:
    """A copy of the first split model the test may write over."""
    for part in model_parts(str(split_models[0])):
        shutil.copy(part, tmp_path)
    return tmp_path / split_models[0].name


def _second_part_of_the_other(model: Path, split_models: tuple[Path, Path]) -> None:
    with open(model_parts(str(model))[1], "r+b") as f:  # in place, as cp onto it writes
        f.write(Path(model_parts(str(split_models[1]))[1]).read_bytes())


def test_identity_and_size_are_every_part_s(model: Path, split_models: tuple[Path, Path]) -> None:
    parts = model_parts(str(model))
    assert parts == [str(model.parent / f"m-0000{i}-of-00003.gguf") for i in (1, 2, 3)]
    total = sum(os.path.getsize(p) for p in parts)
    assert model_bytes(str(model)) == total > os.path.getsize(parts[0]) * 2
    before = identify(str(model))
    assert before.size_bytes == total
    _second_part_of_the_other(model, split_models)
    assert identify(str(model)).digest != before.digest
    os.unlink(parts[2])
    with pytest.raises(ModelError, match=f"^{parts[2]}: cannot read the model file"):
        identify(str(model))


def test_a_part_written_over_during_the_run_is_seen(model: Path, split_models: tuple[Path, Path]) -> None:
    watch = ModelFile(identify(str(model)))
    spec = WorkerSpec(0, (0,), str(model))
    watch.check_answers(spec)
    _second_part_of_the_other(model, split_models)
    try:
        with pytest.raises(ModelError, match="the model file was written over while the workers answered from it"):
            watch.check_answers(spec)
        with pytest.raises(ModelError, match="the model file changed while the run went on"):
            watch.check_start(spec)
    finally:
        watch.close()


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_rerun_after_a_part_changed_answers_again(model: Path, split_models: tuple[Path, Path],
                                                    questions_file, tmp_path: Path) -> None:
    out, report = tmp_path / "a.jsonl", tmp_path / "r.json"
    args = ("run", "--model", model, "--input", questions_file(3), "--output", out, "--max-tokens", 4,
            "--workers", 1, "--progress", "off", "--report", report)
    assert (done := ggbatch(*args)).returncode == 0, done.stderr
    written = json.loads(report.read_text())
    assert written["model"]["size_bytes"] == model_bytes(str(model))
    plan = written["memory"]["plan"]
    assert plan["shared_file_pages_mib"] == pytest.approx(model_bytes(str(model)) / 2**20, abs=0.1)
    _second_part_of_the_other(model, split_models)
    again = ggbatch(*args)
    # the journal's answers were made with the other weights: not reused, the rerun is refused
    assert again.returncode == 2
    assert f"{out}.journal.jsonl: 'model' changed since the journaled run" in again.stderr
