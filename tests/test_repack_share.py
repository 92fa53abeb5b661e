"""The repacked copy a worker holds is what llama.cpp's repacked layouts take of the model, read
from its tensor table (runner/plan/repack_share.py). It was a fixed 40% of the file: a phantom
copy for an f16 model (whose layout shrank for nothing, and the summary said "repacked"), and 40%
planned of a Q4_0 MoE that llama.cpp repacks 97% of."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ggbatch.runner.model.make import modelgen as mg
from ggbatch.runner.model.make.llama_gen import LlamaShape
from ggbatch.runner.model.make.qwen3_gen import Qwen3MoeShape
from ggbatch.runner.plan.repack import cpu_flags
from ggbatch.runner.plan.repack_check import repack_refused
from ggbatch.runner.plan.repack_share import repacked_bytes
from helpers import ggbatch

MIB = 2**20
BUFFER = re.compile(r"(CPU_REPACK|AMX) model buffer size = +([0-9.]+) MiB")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An f16 llama, the same as Q8_0, a Q4_0 MoE whose experts are most of the file, and a llama of
    rows K-quants take (256 wide) as Q4_K_M (Q4_K beside Q6_K) and Q2_K (repacked with AVX-512 only)."""
    folder = tmp_path_factory.mktemp("repack_share")
    f16 = mg.make_model(folder / "f16.gguf", "demo", seed=0, ftype="f16")
    q8 = mg.make_model(folder / "q8.gguf", "demo", seed=0, ftype="f16", quant="q8_0")
    shape = Qwen3MoeShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=512, head_dim_override=64,
                          n_expert=16, n_expert_used=2, n_ff_exp=256, tied_embeddings=False)
    moe_f16 = folder / "moe_f16.gguf"
    mg.write_model_gguf(moe_f16, shape, mg.build_demo_vocab())
    mg.quantize(moe_f16, folder / "moe_q4_0.gguf", "q4_0")
    wide = folder / "wide_f16.gguf"
    mg.write_model_gguf(wide, LlamaShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=512),
                        mg.build_demo_vocab())
    for quant in ("q4_k_m", "q2_k"):
        mg.quantize(wide, folder / f"wide_{quant}.gguf", quant)
    return {"f16": str(f16), "q8_0": str(q8), "moe_q4_0": str(folder / "moe_q4_0.gguf"),
            **{f"wide_{quant}": str(folder / f"wide_{quant}.gguf") for quant in ("q4_k_m", "q2_k")}}


def llama_cpp_repacked_mib(model: str) -> float:
    """What llama.cpp itself copies into its repacked buffers loading `model` here."""
    done = subprocess.run([sys.executable, "-c", "import sys; from llama_cpp import Llama; "
                           "Llama(sys.argv[1], n_ctx=64, verbose=True)", model],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return sum(float(m[2]) for m in BUFFER.finditer(done.stderr))


@pytest.mark.model
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["f16", "q8_0", "moe_q4_0", "wide_q4_k_m", "wide_q2_k"])
def test_the_planned_copy_is_what_llama_cpp_repacks_here(models: dict[str, str], name: str) -> None:
    if repack_refused():
        pytest.skip("this CPU refuses llama.cpp's repacked kernels")
    planned = repacked_bytes(models[name], cpu_flags())
    assert planned is not None
    assert planned / MIB == pytest.approx(llama_cpp_repacked_mib(models[name]), abs=0.01)
    if name == "f16":
        assert planned == 0
    if name == "moe_q4_0" and cpu_flags() & {"avx2", "asimd"}:
        assert planned > 0.9 * Path(models[name]).stat().st_size  # the experts; 0.4 was planned
    if name == "wide_q2_k" and {"avx2", "avx512f"} <= cpu_flags():
        assert planned > 0  # Q2_K's interleaved kernel is AVX-512's alone


@pytest.mark.model
@pytest.mark.timeout(300)
def test_an_f16_model_is_plain_with_nothing_to_repack(models: dict[str, str], questions_file, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    done = ggbatch("run", "--model", models["f16"], "--input", questions_file(2), "--output", tmp_path / "a.jsonl",
                   "--max-tokens", 2, "--workers", 1, "--progress", "off", "--report", report)
    assert done.returncode == 0, done.stderr
    written = json.loads(report.read_text())
    assert (written["layout"]["repack_weights"], written["layout"]["repack_reason"]) == (False, "nothing to repack")
    assert written["memory"]["plan"]["weights_per_worker_mib"] == 0
    assert "weights not repacked (nothing to repack)" in done.stdout + done.stderr
