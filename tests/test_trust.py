"""What a careful user tries in a hostile week: every case ends in the right answers or in one
line naming the problem. Real processes, the real tiny model."""

from __future__ import annotations

import json
import resource
import shutil

import pytest

from ggbatch.runner.model.gguf_header import read_layout
from helpers import ggbatch as cli

pytestmark = [pytest.mark.timeout(180), pytest.mark.model]


def ggbatch(*args, **kwargs):
    return cli("run", *args, timeout=150, **kwargs)


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"questionID": f"q{i}", "question": f"Once upon a time {i}"}) + "\n"
                            for i in range(6)))
    return path


def one_error_line(r):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert lines and lines[-1].startswith("ggbatch: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[-1]


def test_a_model_with_other_weights_of_the_same_size_is_not_resumed(tmp_path, demo_model, questions):
    model = tmp_path / "m.gguf"
    shutil.copy(demo_model, model)
    out = tmp_path / "a.json"
    assert ggbatch("--model", model, "--input", questions, "--output", out, "--max-tokens", 4).returncode == 0
    layout = read_layout(str(model))
    last = max(layout.tensor_offsets)
    with open(model, "r+b") as f:  # "re-exported": one weight deep inside changes, the size does not
        f.seek(last + (layout.file_size - last) // 2)
        f.write(b"\x7f")
    line = one_error_line(ggbatch("--model", model, "--input", questions, "--output", out, "--max-tokens", 4))
    assert "'model' changed since the journaled run" in line and "--fresh" in line


def test_a_context_cut_is_not_resumed_into_a_plain_run(tmp_path, demo_model, questions):
    out = tmp_path / "a.json"
    # The demo model's chat template makes each prompt 24 tokens: 26 leave room for 2 of the 4.
    assert ggbatch("--model", demo_model, "--input", questions, "--output", out, "--max-tokens", 4,
                   "--n-ctx", 26).returncode == 0
    line = one_error_line(ggbatch("--model", demo_model, "--input", questions, "--output", out, "--max-tokens", 4))
    assert "'model.n_ctx' changed since the journaled run (26 -> 'auto')" in line


def test_a_misspelt_template_field_is_exit_2_naming_the_field_and_the_record(tmp_path, demo_model, questions):
    out = tmp_path / "a.json"
    line = one_error_line(ggbatch("--model", demo_model, "--input", questions, "--output", out,
                                  "--template", "Q: {{ questoin }}"))
    assert f"{questions}:1: record 'q0' has no field 'questoin' that prompt.template uses" in line
    assert not out.exists()


def test_a_run_refused_for_its_input_does_not_block_the_corrected_rerun(tmp_path, demo_model, questions):
    """A refused run left its journal's header only; the rerun with the setting fixed as the
    message asked was refused as a changed setting. A journal with no answer is replaced."""
    out = tmp_path / "a.json"
    line = one_error_line(ggbatch("--model", demo_model, "--input", questions, "--output", out,
                                  "--template", "{{ ctx }} {{ question }}"))
    assert "has no field 'ctx'" in line
    r = ggbatch("--model", demo_model, "--input", questions, "--output", out, "--template", "Q: {{ question }}",
                "--max-tokens", 4)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(out.read_text())) == 6
    # --choices auto on records without choices, then fixed choices: the same
    line = one_error_line(ggbatch("--model", demo_model, "--input", questions, "--output", tmp_path / "b.json",
                                  "--choices", "auto"))
    assert "has no 'choices'" in line
    r = ggbatch("--model", demo_model, "--input", questions, "--output", tmp_path / "b.json", "--choices", "A,B")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("flag,value", [("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "nan")])
def test_non_finite_numbers_are_refused(tmp_path, demo_model, questions, flag, value):
    line = one_error_line(ggbatch("--model", demo_model, "--input", questions, "--output", tmp_path / "a.json",
                                  flag, value))
    assert "must be a finite number" in line


def test_a_tight_ulimit_v_is_one_line_naming_the_limit(tmp_path, demo_model, questions):
    # 150 MiB of address space: the coordinator starts, a worker cannot map llama.cpp's buffers.
    limit = 150 << 20
    r = ggbatch("--model", demo_model, "--input", questions, "--output", tmp_path / "a.json",
                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    line = one_error_line(r)
    assert "address-space limit of 150 MiB per process (ulimit -v)" in line
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("limit,workers", [(16, 1), (24, 2)])
def test_a_tight_ulimit_n_is_one_line_naming_the_limit(tmp_path, demo_model, questions, limit, workers):
    """Too few file descriptors for the workers' and the tokenizer's pipes ended in 50 lines of
    multiprocess's traceback, exit 1."""
    r = ggbatch("--model", demo_model, "--input", questions, "--output", tmp_path / "a.json", "--workers", workers,
                "--threads", 1, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
    line = one_error_line(r)
    assert f"too many open files: this process may hold {limit} (ulimit -n)" in line
