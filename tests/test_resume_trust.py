"""Resumed and streamed runs answer as one uninterrupted run does: an answer taken from the
journal is written as its line asks (issue 29, item 7), and a streamed file's later, longer
questions are answered, not refused for a context sized on its first window (item 20). Real
processes, the real tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from conftest import ROOT, gsm8k_records

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def ggbatch(*args):
    return subprocess.run([sys.executable, "-m", "ggbatch", "run", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=150)


def batch_requests(n: int) -> list[dict]:
    """n OpenAI Batch lines on GSM8K questions, /v1/chat/completions and /v1/completions in turn."""
    lines = []
    for i, rec in enumerate(gsm8k_records(n)):
        text = rec["question"][:160]
        if i % 2:
            lines.append({"custom_id": f"c{i}", "method": "POST", "url": COMPLETIONS,
                          "body": {"model": "gpt-3.5-turbo-instruct", "prompt": text, "max_tokens": 12}})
        else:
            lines.append({"custom_id": f"m{i}", "method": "POST", "url": CHAT,
                          "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}],
                                   "max_tokens": 12}})
    return lines


def write_lines(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def checked_bodies(path: Path, requests: list[dict]) -> list[dict]:
    """The output's lines, each body read with the openai package's type for its line's url."""
    out = [json.loads(line) for line in path.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == [r["custom_id"] for r in requests]
    for o, r in zip(out, requests):
        assert o["error"] is None, o
        body = o["response"]["body"]
        if r["url"] == COMPLETIONS:
            assert Completion.model_validate(body).object == "text_completion", o
        else:
            assert ChatCompletion.model_validate(body).object == "chat.completion", o
    return out


def without_times(lines: list[dict]) -> list[dict]:
    """The lines less what says when each answer was made (ids derive from it, and created)."""
    for line in lines:
        line.pop("id")
        line["response"].pop("request_id")
        line["response"]["body"].pop("id")
        line["response"]["body"].pop("created")
    return lines


@pytest.mark.timeout(240)
@pytest.mark.model
@pytest.mark.slow
def test_a_resumed_openai_batch_writes_each_journaled_answer_as_its_line_asks(tmp_path, stories):
    requests = batch_requests(16)
    whole, out = tmp_path / "whole.jsonl", tmp_path / "out.jsonl"
    questions = tmp_path / "batch.jsonl"
    write_lines(questions, requests)
    args = ("--model", stories, "--input", questions, "--max-tokens", 12)
    assert (r := ggbatch(*args, "--output", whole)).returncode == 0, r.stderr
    expected = without_times(checked_bodies(whole, requests))

    write_lines(questions, requests[:7])  # a first run over the start of the file ...
    assert (r := ggbatch(*args, "--output", out)).returncode == 0, r.stderr
    write_lines(questions, requests)  # ... then the whole file: 7 answers come from the journal
    report = tmp_path / "report.json"
    assert (r := ggbatch(*args, "--output", out, "--report", report)).returncode == 0, r.stderr
    assert json.loads(report.read_text())["questions"]["from_journal"] == 7
    resumed = out.read_bytes()
    assert without_times(checked_bodies(out, requests)) == expected

    # A rerun takes every answer from the journal and writes the same file, ids included.
    assert (r := ggbatch(*args, "--output", out)).returncode == 0, r.stderr
    assert out.read_bytes() == resumed

