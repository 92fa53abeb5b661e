"""Shared fixtures. Tests that need a model, not a trained one, run on the demo model the project
generates itself (`demo_model`) and on questions they write (`questions_file`). Only what needs
a trained model's answers, a real vocabulary or a real data set takes it from ../shared beside
the project (GGBATCH_SHARED elsewhere), and skips without it, saying which."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# GGBATCH_SHARED points elsewhere (a missing folder shows what a fresh clone skips).
SHARED = Path(os.environ.get("GGBATCH_SHARED", ROOT.parent / "shared"))
MODELS = SHARED / "models"
DATA = SHARED / "data"
STORIES = MODELS / "stories260K.gguf"
GSM8K = DATA / "gsm8k" / "questions.jsonl"

# Ctrl-C reaches the processes the tests start as it reaches a terminal's: a runner started as a
# shell's background job (`cmd &`) ignores SIGINT and so would they, as ggbatch leaves an ignored
# signal ignored (runner/pool/signals.py). A handled signal is the default again in a child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, str(ROOT / "tests"))  # spawned workers import tests' fake engine from here

from helpers import write_jsonl, write_questions  # noqa: E402  (found through the path above)


def require(path: Path, needs: str = "a file from ../shared") -> Path:
    """`path` from ../shared, or a skip that says what the test needs it for."""
    if not path.exists():
        pytest.skip(f"needs {needs}: {path} is absent (../shared beside the project, or GGBATCH_SHARED)")
    return path


def two_cores() -> tuple[int, int]:
    """Two of the cores this process may use: a worker on them can give a thread up."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("a worker needs 2 cores to give one up")
    return cores[0], cores[1]


@pytest.fixture
def stories() -> str:
    """stories260K, for tests on a trained model's answers (a random model's are noise)."""
    return str(require(STORIES, "stories260K's trained weights"))


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> str:
    """The demo model (`ggbatch make-model --shape demo`: a small random llama with the demo
    vocabulary), built once a session: for tests that need a model, not a trained one."""
    from ggbatch.runner.model.make import modelgen as mg
    return str(mg.make_model(tmp_path_factory.mktemp("demo") / "demo.gguf", "demo", seed=0, ftype="f32"))


@pytest.fixture(scope="session")
def demo_q4_model(tmp_path_factory) -> str:
    """The demo model quantized to Q4_0: weights llama.cpp's repacked kernels take, for tests of
    whether a layout repacks them (the f32 demo model has nothing to repack)."""
    from ggbatch.runner.model.make import modelgen as mg
    return str(mg.make_model(tmp_path_factory.mktemp("demo_q4") / "demo-q4_0.gguf", "demo", quant="q4_0", seed=0))


@pytest.fixture(scope="session")
def think_model(tmp_path_factory) -> str:
    """The demo model as a reasoning model that writes <think> blocks (`make-model --reasoning
    think`), built once a session."""
    from ggbatch.runner.model.make import modelgen as mg
    return str(mg.make_model(tmp_path_factory.mktemp("think") / "think.gguf", "demo", ftype="f32", reasoning="think"))


@pytest.fixture(scope="session")
def harmony_model(tmp_path_factory) -> str:
    """The demo model with gpt-oss's harmony channels (`make-model --reasoning harmony`), once a session."""
    from ggbatch.runner.model.make import modelgen as mg
    return str(mg.make_model(tmp_path_factory.mktemp("harmony") / "harmony.gguf", "demo", ftype="f32",
                             reasoning="harmony"))


@pytest.fixture(scope="session")
def arch_models(tmp_path_factory) -> "_Made":
    """The tiny models of other architectures (`ggbatch make-model --shape qwen3-tiny`, ...), each
    built the first time a test asks for it, once a session: arch_models["mamba2-tiny"]."""
    from ggbatch.runner.model.make import modelgen as mg

    folder = tmp_path_factory.mktemp("archs")
    return _Made(lambda name: str(mg.make_model(folder / f"{name}.gguf", name)))


@pytest.fixture(scope="session")
def arch_tokenizers(arch_models):
    """Each architecture model's llama.cpp tokenizer, loaded once a session."""
    from ggbatch.workers.llama.model_runner import Tokenizer

    made = _Made(lambda name: Tokenizer(arch_models[name]))
    yield made
    for tok in made.values():
        tok.close()


class _Made(dict):
    """A dict that makes a missing entry with `make(key)` the first time it is asked for."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key: str):
        self[key] = self.make(key)
        return self[key]

def gsm8k_records(n: int) -> list[dict]:
    with open(require(GSM8K, "GSM8K's real questions and gold answers"), encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


@pytest.fixture
def questions_file(tmp_path):
    """questions_file(n) -> path of a .jsonl of n GSM8K-like questions the test writes itself."""
    def make(n: int, name: str = "questions.jsonl") -> str:
        return str(write_questions(tmp_path / name, n))
    return make


@pytest.fixture
def gsm8k_file(tmp_path):
    """gsm8k_file(n) -> path of a .jsonl holding the first n real GSM8K questions."""
    def make(n: int, name: str = "questions.jsonl") -> str:
        rows = [{"questionID": r["questionID"], "question": r["question"]} for r in gsm8k_records(n)]
        return str(write_jsonl(tmp_path / name, rows))
    return make


@pytest.fixture(scope="session", autouse=True)
def _plain_reference_weights_where_repacking_fails(tmp_path_factory):
    """The references the tests compute with llama-cpp-python's own Llama in this process load a
    quantized model's weights as ggbatch's plan would: plain where this CPU refuses llama.cpp's
    repacked kernels (helpers.repack_runs). Llama takes no such setting, so its default model
    parameters are read with use_extra_bufts off for the session; nothing else changes."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.getbasetemp() / "cache")  # as _isolated_cache sets it
    from helpers import repack_runs

    if repack_runs():
        yield
        return
    import llama_cpp.llama_cpp as lib

    defaults = lib.llama_model_default_params

    def plain() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = plain
    try:
        yield
    finally:
        lib.llama_model_default_params = defaults


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
