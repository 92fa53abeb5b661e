"""Shared fixtures. Real models and data come from ../shared beside the project; tests that need
them skip with the reason when it is absent."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODELS = SHARED / "models"
DATA = SHARED / "data"
STORIES = MODELS / "stories260K.gguf"
GSM8K = DATA / "gsm8k" / "questions.jsonl"

sys.path.insert(0, str(ROOT / "tests"))  # spawned workers import tests' fake engine from here


def require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (the tests look for ../shared beside the project)")
    return path


def two_cores() -> tuple[int, int]:
    """Two of the cores this process may use: a worker on them can give a thread up."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("a worker needs 2 cores to give one up")
    return cores[0], cores[1]


@pytest.fixture
def stories() -> str:
    return str(require(STORIES))


def gsm8k_records(n: int) -> list[dict]:
    with open(require(GSM8K), encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


@pytest.fixture
def gsm8k_file(tmp_path):
    """gsm8k_file(n) -> path of a .jsonl holding the first n GSM8K questions."""
    def make(n: int, name: str = "questions.jsonl") -> str:
        path = tmp_path / name
        with open(path, "w", encoding="utf-8") as f:
            for rec in gsm8k_records(n):
                f.write(json.dumps({"questionID": rec["questionID"], "question": rec["question"]}) + "\n")
        return str(path)
    return make


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # The demo model is cached per user; tests share one cache folder for the session.
    cache = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    os.makedirs(cache, exist_ok=True)


@pytest.fixture(scope="session")
def k_quant_model(tmp_path_factory) -> str:
    """A tiny random-weight Q4_K_M model, built once. llama.cpp multiplies K-quant weights with
    its tiled kernel from 8 batch rows on (ggml-cpu tiled/tiled.cpp), with vec_dot below, and
    random weights make near-ties between the top two tokens common: a row that takes another
    kernel in another batch shows in greedy answers."""
    from ggbatch.runner.model.make import modelgen as mg
    folder = tmp_path_factory.mktemp("kquant")
    shape = mg.ModelShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=512)
    src = mg.write_random_llama_gguf(folder / "f16.gguf", shape, mg.build_demo_vocab(), seed=0)
    return str(mg.quantize(src, folder / "q4_k_m.gguf", "q4_k_m"))
