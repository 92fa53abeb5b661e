"""A model's identity (runner/model/identity.py): what decides whether a journal's answers may be reused."""

from __future__ import annotations

import os
import shutil
import struct
import time

import gguf
import pytest

from conftest import MODELS, require
from ggbatch.runner.errors import ModelError
from ggbatch.runner.model.gguf_header import GGUFFormatError, read_layout
from ggbatch.runner.model.identity import identify, resolve_model, sample_offsets
from helpers import ggbatch


@pytest.fixture
def copy(tmp_path, demo_model):
    path = tmp_path / "m.gguf"
    shutil.copy(demo_model, path)
    return path


def test_layout_agrees_with_the_gguf_package(demo_model):
    layout = read_layout(demo_model)
    reader = gguf.GGUFReader(demo_model)
    assert layout.data_start == reader.data_offset
    assert sorted(layout.tensor_offsets) == sorted(int(t.data_offset) for t in reader.tensors)


def test_the_same_bytes_elsewhere_are_the_same_model(copy, demo_model):
    assert identify(str(copy)).digest == identify(demo_model).digest


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("where", ["middle of the last tensor", "first tensor start", "metadata"])
def test_other_weights_of_the_same_size_are_another_model(copy, demo_model, where):
    layout = read_layout(str(copy))
    last = max(layout.tensor_offsets)
    offset = {"middle of the last tensor": last + (layout.file_size - last) // 2,
              "first tensor start": min(layout.tensor_offsets),
              "metadata": 40}[where]
    assert offset in sample_offsets(layout) or where == "metadata"
    flip_byte(copy, offset)
    assert copy.stat().st_size == layout.file_size
    assert identify(str(copy)).digest != identify(demo_model).digest


def test_identifying_a_big_vocabulary_is_quick():
    qwen = require(MODELS / "ggml-vocab-qwen2.gguf", "a real vocabulary's header")  # 151,936 tokens in the header
    t0 = time.perf_counter()
    identity = identify(str(qwen))
    assert time.perf_counter() - t0 < 1.0
    assert read_layout(str(qwen)).header_end > 5_000_000 and len(identity.digest) == 64


def test_a_files_header_is_read_once_until_the_file_changes(copy, tmp_path):
    """A run's start read a large vocabulary's header five or six times (identity, the layout's
    repacked bytes, the hybrid check, the memory plan: about 50 ms each for 151,936 tokens)."""
    from ggbatch.runner.model import gguf_header
    from ggbatch.runner.model.make import modelgen as mg

    path = str(copy)
    first = gguf_header.read_hparams(path)
    parsed = gguf_header._hparams.cache_info().misses
    first["llama.block_count"] = -1  # the caller's own copy
    again = gguf_header.read_hparams(path)
    assert again["llama.block_count"] == 2 and gguf_header._hparams.cache_info().misses == parsed
    assert read_layout(path) is read_layout(path)
    # written again in place, another shape: read again
    other = mg.make_model(tmp_path / "other.gguf", "qwen3-tiny")
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(open(other, "rb").read())
    assert gguf_header.read_hparams(path)["general.architecture"] == "qwen3"
    assert read_layout(path).file_size == os.path.getsize(other)


@pytest.mark.parametrize("content,message", [
    (b"GGUF" + struct.pack("<I", 3), "too short"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 10**12) + bytes(32), "header ends early"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99) + bytes(8),
     "unknown metadata value type 99"),
])
def test_a_broken_header_is_one_line(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=message):
        identify(str(path))
    with pytest.raises(GGUFFormatError):
        read_layout(str(path))


def test_resolve_model_refuses_in_one_line(tmp_path):
    with pytest.raises(ModelError, match="model file not found"):
        resolve_model(str(tmp_path / "none.gguf"))
    with pytest.raises(ModelError, match="directory"):
        resolve_model(str(tmp_path))
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(ModelError, match="no GGUF magic"):
        resolve_model(str(tmp_path / "text.gguf"))


@pytest.mark.timeout(120)
def test_a_demo_model_whose_cache_folder_cannot_be_made_is_one_line_exit_2(tmp_path):
    """A cache under a file (or a HOME the user cannot write, as a cron user's may be): exit 1
    and a traceback were a run whose questions failed."""
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"questionID": "a", "question": "Hi?"}\n')
    env = {**os.environ, "XDG_CACHE_HOME": str(questions / "cache")}
    done = ggbatch("run", "--model", "demo", "--input", questions, "--output", tmp_path / "a.json", "-q", env=env,
                   timeout=100)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"ggbatch: error: model: demo: cannot build the demo model in ggbatch's cache folder "
                           f"{questions}/cache/ggbatch (Not a directory: {questions}/cache/ggbatch): set "
                           "XDG_CACHE_HOME to a folder this user can write\n")
