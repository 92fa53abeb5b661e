"""What auto decided is kept when a job resumes (runner/journal/ran.py): flash attention on auto
is off on a CPU up to 4,096 tokens a sequence, decided from the context of the questions a run
holds, and a rerun holds only those left. Real processes, a real random model whose trained
context is long enough to pass that bound."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import ggbatch as cli

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> str:
    """The demo model's shape with a trained context of 16,384 tokens."""
    from ggbatch.runner.model.make.modelgen import SHAPES, build_demo_vocab, write_model_gguf

    path = tmp_path_factory.mktemp("long") / "long.gguf"
    return str(write_model_gguf(path, replace(SHAPES["demo"], n_ctx=16384), build_demo_vocab(), ftype="f32"))


def run(model: str, questions: Path, out: Path, *flags: object):
    return cli("run", "--model", model, "--input", questions, "--output", out, "--report", out.with_suffix(".report"),
               "--max-tokens", 8, "--workers", 1, "--slots", 1, "--token-logprobs", 2, "--progress", "off", *flags,
               timeout=280)


def test_a_job_killed_after_its_long_question_resumes_with_the_flash_attention_it_ran(tmp_path, long_context_model):
    questions = tmp_path / "q.jsonl"
    long = " ".join(f"word{i % 50} and" for i in range(2200))
    lines = [{"questionID": "long", "question": long}]
    lines += [{"questionID": f"s{i}", "question": f"What is {i} and {i + 1}?"} for i in range(3)]
    questions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    whole = tmp_path / "whole.jsonl"
    assert (r := run(long_context_model, questions, whole)).returncode == 0, r.stderr
    layout = json.loads(whole.with_suffix(".report").read_text())["layout"]
    assert layout["n_ctx_per_sequence"] > 4096 and layout["flash_attn"] is True

    # Killed once the long question was journaled: the journal's header, what the run decided,
    # and that answer. The rerun holds only the short questions.
    journal = Path(f"{whole}.journal.jsonl").read_text().splitlines(keepends=True)
    assert json.loads(journal[1]) == {"ggbatch_ran": {"flash_attn": True}}
    resumed = tmp_path / "resumed.jsonl"
    Path(f"{resumed}.journal.jsonl").write_text("".join(line for line in journal if '"qid": "s' not in line))
    assert (r := run(long_context_model, questions, resumed)).returncode == 0, r.stderr
    report = json.loads(resumed.with_suffix(".report").read_text())
    assert report["questions"]["from_journal"] == 1
    assert report["layout"]["flash_attn"] is True  # was False: the short questions' context is under 4,096
    assert resumed.read_text() == whole.read_text()

    # Named as it ran, the rerun is accepted; named otherwise, refused with the setting named.
    assert (r := run(long_context_model, questions, resumed, "--flash-attn", "true")).returncode == 0, r.stderr
    refused = run(long_context_model, questions, resumed, "--flash-attn", "false")
    assert refused.returncode == 2 and "'flash_attn' changed since the journaled run (true -> false)" in refused.stderr


def test_shards_that_decided_flash_attention_apart_are_merged_with_a_warning(tmp_path, long_context_model):
    """Each shard decides auto for the questions it holds: the one with the long question runs
    flash attention and the other does not, so a near-tie may part from one run's answer."""
    questions = tmp_path / "q.jsonl"
    lines = [{"questionID": f"q{i}", "question": f"What is {i} and {i + 1}?"} for i in range(6)]
    lines[0]["question"] = " ".join(f"word{i % 50} and" for i in range(2200))
    questions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "a.jsonl"
    for shard in ("0/2", "1/2"):
        assert (r := run(long_context_model, questions, out, "--shard", shard)).returncode == 0, r.stderr
    parts = [tmp_path / f"a.shard-{i}-of-2.jsonl" for i in range(2)]
    ran = {p: json.loads(Path(f"{p}.journal.jsonl").read_text().splitlines()[1])["ggbatch_ran"] for p in parts}
    assert sorted(r["flash_attn"] for r in ran.values()) == [False, True]
    merged = cli("merge", "--input", questions, "--output", tmp_path / "m.jsonl", *parts, timeout=60)
    assert merged.returncode == 0, merged.stderr
    on = next(p for p, r in ran.items() if r["flash_attn"])
    off = next(p for p in parts if p != on)
    assert f"ggbatch: {on} ran flash attention and {off} did not (flash_attn: auto decides it" in merged.stderr
    assert "set flash_attn to make the shards agree" in merged.stderr

    for shard in ("0/2", "1/2"):  # set, the shards agree and the merge says nothing
        r = run(long_context_model, questions, out, "--shard", shard, "--flash-attn", "false", "--fresh")
        assert r.returncode == 0, r.stderr
    merged = cli("merge", "--input", questions, "--output", tmp_path / "m.jsonl", *parts, timeout=60)
    assert merged.returncode == 0 and "flash attention" not in merged.stderr, merged.stderr
