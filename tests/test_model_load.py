"""A model that cannot load says why: memory, a truncated file, an unreadable file, an unknown
architecture; one line, exit code 2, through the command line too. Real llama.cpp loads, under
real limits (an address-space rlimit, a file the process may not read)."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from ggbatch.workers.llama.load_errors import describe_load_failure, memory_sign
from helpers import ggbatch_command

pytestmark = [pytest.mark.timeout(120), pytest.mark.model]

FAILED = "llama_model_load_from_file_impl: failed to load model\n"
LOGGED = [  # (what llama.cpp 0.3.36 logs, the start of what the user reads)
    (["llama_model_load: error loading model: mmap failed: Cannot allocate memory\n", FAILED],
     "not enough memory to load m.gguf (mmap failed: Cannot allocate memory)"),
    (["llama_model_load: error loading model: std::bad_alloc\n", FAILED],
     "not enough memory to load m.gguf (std::bad_alloc)"),
    (["llama_model_load: error loading model: unknown model architecture: 'mamba9'\n", FAILED],
     "m.gguf: model architecture 'mamba9' is unknown to this llama.cpp build"),
    (["llama_model_load: error loading model: tensor 'token_embd.weight' data is not within the file bounds, "
      "model is corrupted or incomplete\n", FAILED], "m.gguf: the model file is truncated or corrupt (tensor"),
    (["gguf_init_from_reader: failed to read key-value pairs\n",
      "llama_model_load: error loading model: llama_model_loader: failed to load model from m.gguf\n", FAILED],
     "m.gguf: the model file is truncated or corrupt (failed to read key-value pairs)"),
    (["gguf_init_from_file: failed to open GGUF file 'm.gguf' (Permission denied)\n",
      "llama_model_load: error loading model: llama_model_loader: failed to load model from m.gguf\n", FAILED],
     "m.gguf: cannot open the model file (Permission denied)"),
    (["llama_model_load: error loading model: error loading model hyperparameters: key not found in model: "
      "llama.context_length\n", FAILED],
     "m.gguf: llama.cpp could not load this model (key not found in model: llama.context_length)"),
    ([], "m.gguf: llama.cpp could not load this model (not a GGUF file"),
]


@pytest.mark.parametrize("lines,message", LOGGED, ids=[m[:40] for _, m in LOGGED])
def test_the_logged_reason_becomes_one_line(lines, message):
    text = describe_load_failure("m.gguf", lines)
    assert text.startswith(message) and "\n" not in text


def test_a_library_that_cannot_be_mapped_is_memory_only_under_an_address_space_limit():
    # Without a limit (this process has none) the loader's words may mean a noexec mount or a bad
    # file; under one, test_tokenizing sees them as the limit running out.
    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY
    assert memory_sign("libgfortran.so.5: failed to map segment from shared object") is None
    assert memory_sign("File \"<frozen importlib._bootstrap>\", line 690 MemoryError") == "MemoryError"
    assert memory_sign("SystemError: error return without exception set") is None


def test_under_an_address_space_limit_an_unmapped_library_and_a_c_error_without_exception_say_memory():
    # CPython's allocation failing inside an import under `ulimit -v` may surface as a SystemError
    # with no exception set, not a MemoryError (the tokenizer process under 117 MiB did)
    import subprocess
    import sys
    check = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (64 << 30, 64 << 30))\n"
             "from ggbatch.workers.llama.load_errors import memory_sign\n"
             "print(memory_sign('x.so: failed to map segment from shared object'))\n"
             "print(memory_sign('line 803, in spec SystemError: error return without exception set'))")
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert r.stdout.splitlines() == ["failed to map segment from shared object",
                                     "SystemError: error return without exception set"], r.stderr


def sparse_model(path, shape="qwen3-1.7b-like"):
    """A real llama GGUF of `shape`'s size (2.7 GiB at f16) whose weights are a hole in a sparse file:
    what loading a big model asks of memory, without the disk."""
    import gguf

    from ggbatch.runner.model.make import modelgen
    dims, tokenizer = modelgen.SHAPES[shape], modelgen.build_demo_vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(dims.n_ctx)
    writer.add_embedding_length(dims.n_embd)
    writer.add_block_count(dims.n_layer)
    writer.add_feed_forward_length(dims.n_ff)
    writer.add_head_count(dims.n_head)
    writer.add_head_count_kv(dims.n_head_kv)
    writer.add_layer_norm_rms_eps(dims.rms_eps)
    tokenizer.add_to(writer)
    data_bytes = 0
    for name, shape_ in dims.tensor_specs(tokenizer.vocab_size):
        dtype = np.dtype(np.float32 if len(shape_) == 1 else np.float16)
        nbytes = int(np.prod(shape_)) * dtype.itemsize
        writer.add_tensor_info(name, shape_, dtype, nbytes)
        data_bytes += -(-nbytes // 32) * 32  # GGUF aligns each tensor to 32 bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    header = os.path.getsize(path)
    os.truncate(path, -(-header // 32) * 32 + data_bytes)
    return path


LIMIT = 1 << 30  # address space: room for Python and llama.cpp, not for mapping a 2.7 GiB model


def limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


LOAD = """
import sys
from ggbatch.workers.llama.model_runner import ModelLoadError, _load_model, model_params
try:
    _load_model(sys.argv[1], model_params(vocab_only=False))
except ModelLoadError as exc:
    print(exc)
else:
    print("loaded")
"""


def load_in_subprocess(path, **kwargs):
    r = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, timeout=60, **kwargs)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def run(model, tmp_path, **kwargs):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"questionID": "a", "question": "Hi?"}) + "\n")
    return subprocess.run(ggbatch_command("run", "--model", str(model), "--input", str(questions),
                                          "--output", str(tmp_path / "a.json"), "--max-tokens", "2"), cwd=ROOT,
                          capture_output=True, text=True, timeout=90, **kwargs)


def one_line_exit_2(r):
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ggbatch: error: "), r.stderr
    return lines[0]


def test_a_model_too_big_for_the_address_space_says_memory(tmp_path):
    model = sparse_model(tmp_path / "big.gguf")
    # the limit is named: the machine itself may have memory to spare
    said = (f"not enough memory to load {model} (mmap failed: Cannot allocate memory) under the address-space "
            f"limit of {LIMIT >> 20} MiB per process (ulimit -v): raise or remove the limit")
    assert load_in_subprocess(model, preexec_fn=limit_address_space) == said
    # Through the command line: the tokenizer process (vocabulary only) loads it; a worker cannot.
    line = one_line_exit_2(run(model, tmp_path, preexec_fn=limit_address_space))
    assert line == f"ggbatch: error: {said}"


CONTEXT = """
from ggbatch.workers.llama.model_runner import ModelLoadError, ModelRunner
try:
    ModelRunner({model!r}, n_threads=1, n_ctx=1 << 22, n_seq_max=1, n_batch=64, kv_unified=True)
except ModelLoadError as exc:
    print(exc)
"""


def test_a_context_too_big_for_the_address_space_says_memory(stories):
    # 2^22 KV cells of stories260K are 2.5 GiB (5 layers × 32 K and 32 V values × 2 bytes), more than the limit.
    r = subprocess.run([sys.executable, "-c", CONTEXT.format(model=stories)], capture_output=True, text=True,
                       timeout=60, preexec_fn=limit_address_space)
    assert r.stdout.startswith(f"not enough memory to create a context of 4194304 tokens for 1 sequence on "
                               f"{stories} ("), r.stdout + r.stderr
    assert r.stdout.count("\n") == 1


def test_a_truncated_model_says_truncated(tmp_path, demo_model):
    model = tmp_path / "truncated.gguf"
    model.write_bytes(Path(demo_model).read_bytes()[:4000])  # cut inside the metadata
    expected = f"{model}: the model file is truncated or corrupt (failed to read key-value pairs)"
    assert load_in_subprocess(model) == expected
    # Through the command line, the model's identity (runner/model/identity.py) reads its header first.
    line = one_line_exit_2(run(model, tmp_path))
    assert line.startswith(f"ggbatch: error: {model}: the model file is truncated or corrupt (the header ends early")


def without_read_permission():
    """Run as root, a process reads any file: drop the capabilities that allow it (setpriv)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, where file permissions do not apply, and setpriv is not installed "
                    "to drop CAP_DAC_OVERRIDE")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def test_a_model_without_read_permission_says_so_naming_the_path(tmp_path, demo_model):
    model = tmp_path / "private.gguf"
    shutil.copy(demo_model, model)
    model.chmod(0)
    prefix = without_read_permission()
    # llama.cpp's own loader (the workers' and the tokenizer process's) ...
    r = subprocess.run([*prefix, sys.executable, "-c", LOAD, str(model)], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == f"{model}: cannot open the model file (Permission denied)", r.stderr
    # ... and the command line, which checks the file before any process starts.
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"questionID": "a", "question": "Hi?"}) + "\n")
    r = subprocess.run([*prefix, sys.executable, "-m", "ggbatch", "run", "--model", str(model), "--input",
                        str(questions), "--output", str(tmp_path / "a.json")], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert one_line_exit_2(r) == f"ggbatch: error: {model}: cannot read the model file (Permission denied)"


def test_the_layers_llama_cpp_offloaded_and_its_errors_are_read_from_its_log():
    # The offload line is printed only by builds that can offload (llama-model.cpp load_tensors);
    # none here. The handler is called as llama.cpp calls it (ggml_log_level: 2 info, 4 error, 5
    # the continuation of the line before).
    from ggbatch.workers.llama import llama_log

    llama_log.errors.clear()
    llama_log.offloaded.clear()
    for level, text in ((2, b"load_tensors: offloading 28 repeating layers to GPU\n"),
                        (2, b"load_tensors: offloaded 29/29 layers to GPU\n"),
                        (5, b"more info\n"),
                        (4, b"llama_model_load: error loading model: "), (5, b"tensor data is not within bounds\n")):
        llama_log._keep(level, text, None)
    assert llama_log.offloaded == [29]
    assert list(llama_log.errors) == ["llama_model_load: error loading model: tensor data is not within bounds\n"]
