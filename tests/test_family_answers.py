"""Fixed choices and JSON schemas on every architecture ggbatch makes test models of: answers
are always one of the choices (read from the logits at the prompt's end) or JSON valid under
the schema (generated under llama.cpp's grammar), with no worker restart, and with
--batch-invariant the same at 1 slot and at 3, the prefix cache on and off. The compatibility
table of docs/guide/models.md cites these."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import STORY_WORDS, ggbatch, write_jsonl

pytestmark = [pytest.mark.model, pytest.mark.slow]

FAMILIES = ["qwen3-tiny", "qwen3moe-tiny", "gemma3-tiny", "qwen35-tiny", "mamba2-tiny", "lfm2-tiny"]
CHOICES = ("A", "B", "C")  # one token each in every vocabulary: answered from the logits
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "blue", "green"]}},
          "required": ["colour"], "additionalProperties": False}


def questions(tmp_path: Path) -> Path:
    rows = [{"questionID": f"q{i}", "question": f"Is the {STORY_WORDS[i % len(STORY_WORDS)]} "
                                                f"{STORY_WORDS[(3 * i) % len(STORY_WORDS)]} happy?"}
            for i in range(8)]
    return write_jsonl(tmp_path / "q.jsonl", rows)


def run(model: str, qs: Path, out: Path, *flags: object) -> tuple[dict[str, object], dict]:
    r = ggbatch("run", "--model", model, "--input", qs, "--output", out, "--report", f"{out}.report.json",
                "--workers", 1, "--batch-invariant", "--progress", "off", *flags, timeout=200)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(Path(f"{out}.report.json").read_text())
    assert [w["restarts"] for w in report["workers"].values()] == [0]
    return {row["questionID"]: row for row in json.loads(out.read_text())}, report


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", FAMILIES)
def test_choices_from_the_logits_on_every_family(arch_models, name, tmp_path):
    qs = questions(tmp_path)
    flags = ("--choices", ",".join(CHOICES), "--choice-logprobs")
    one, _ = run(arch_models[name], qs, tmp_path / "one.json", "--slots", 1, "--prefix-cache", "off", *flags)
    many, _ = run(arch_models[name], qs, tmp_path / "many.json", "--slots", 3, *flags)
    assert one == many
    for row in one.values():
        assert row["answer"] in CHOICES
        scores = row["choice_logprobs"]
        assert max(scores, key=scores.get) == row["answer"]  # the most likely choice at the prompt's end


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", FAMILIES)
def test_a_json_schema_on_every_family(arch_models, name, tmp_path):
    qs = questions(tmp_path)
    flags = ("--json-schema", json.dumps(SCHEMA), "--max-tokens", 48)
    one, _ = run(arch_models[name], qs, tmp_path / "one.json", "--slots", 1, "--prefix-cache", "off", *flags)
    many, _ = run(arch_models[name], qs, tmp_path / "many.json", "--slots", 3, *flags)
    assert one == many
    for row in one.values():
        assert json.loads(row["answer"])["colour"] in SCHEMA["properties"]["colour"]["enum"]
