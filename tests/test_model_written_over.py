"""A model file written over in place during a run (`cp` onto it, `dd conv=notrunc`, `rsync
--inplace`) changes the weights under the workers' mapping: the answers made since are not kept,
the run ends with exit 2 naming the file, and a rerun with the first file back finishes with the
answers an uninterrupted run gives."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT
from ggbatch.runner.errors import ModelError
from ggbatch.runner.model.identity import identify
from ggbatch.runner.model.make import modelgen as mg
from ggbatch.runner.pool.model_file import ModelFile
from ggbatch.workers.spec import WorkerSpec
from helpers import ggbatch, ggbatch_command, journal_entries, wait_for


@pytest.fixture
def two_models(tmp_path, demo_model):
    """(the run's model, a copy of it, another model of the very same size)."""
    model, first = tmp_path / "m.gguf", tmp_path / "first.gguf"
    shutil.copy(demo_model, model)
    shutil.copy(demo_model, first)
    other = mg.make_model(tmp_path / "other.gguf", "demo", seed=7, ftype="f32")
    assert os.path.getsize(other) == os.path.getsize(model)
    return model, first, Path(other)


def _write_over(target: Path, source: Path) -> None:
    with open(target, "r+b") as f:  # in place: the same inode, as dd conv=notrunc writes
        f.write(source.read_bytes())


def test_a_touched_model_is_the_same_model_and_one_written_over_is_not(two_models):
    model, _, other = two_models
    watch = ModelFile(identify(str(model)))
    spec = WorkerSpec(0, (0,), str(model))
    watch.check_answers(spec)
    os.utime(model, (time.time() + 5, time.time() + 5))  # touched: the same bytes
    watch.check_answers(spec)
    watch.check_start(spec)
    _write_over(model, other)
    with pytest.raises(ModelError, match="the model file was written over while the workers answered from it"):
        watch.check_answers(spec)
    with pytest.raises(ModelError, match="the model file changed while the run went on"):
        watch.check_start(spec)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_whose_model_is_written_over_keeps_only_the_answers_made_before(tmp_path, two_models,
                                                                             questions_file):
    model, first, other = two_models
    questions = questions_file(24)
    args = ("run", "--model", model, "--input", questions, "--max-tokens", 24, "--batch-invariant", "-q")
    reference = tmp_path / "reference.jsonl"
    assert (r := ggbatch(*args, "--output", reference)).returncode == 0, r.stderr
    out = tmp_path / "a.jsonl"
    proc = subprocess.Popen(ggbatch_command(*args, "--output", out, "--slots", 1, "--workers", 1, "--threads", 1),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_entries(out) >= 2, 120, "two journaled answers")
    _write_over(model, other)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert f"{model}: the model file was written over while the workers answered from it" in stderr
    assert not out.exists()  # exit 2 writes no answers file
    journaled = journal_entries(out)
    assert 2 <= journaled < 24
    _write_over(model, first)
    r = ggbatch(*args, "--output", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == reference.read_bytes()
