"""Choices the model's vocabulary cannot write are refused by one rule (runner/config/answer.py
spelling_problem), whether the job lists them (exit 2 before any question) or a record brings its
own (answer.choices: auto: that record fails, the others are answered)."""

from __future__ import annotations

import json
import subprocess
from array import array
from pathlib import Path

import pytest

from conftest import MODELS, ROOT, require
from ggbatch.runner.config.answer import spelling_problem
from helpers import ggbatch_command as ggbatch_cmd
from helpers import write_questions

TINYSTORIES = MODELS / "TinyStories-656K-Q8_0.gguf"
UNKNOWN = "the model's tokenizer reads a character of it as its unknown token"


def run(model: Path, questions: Path, out: Path, choices: str) -> subprocess.CompletedProcess:
    return subprocess.run(ggbatch_cmd("run", "--model", model, "--input", questions, "--output", out,
                                      "--max-tokens", 4, "--workers", 1, "--choices", choices),
                          cwd=ROOT, capture_output=True, text=True, timeout=90)


def test_the_rule_is_the_tokenizers_refusal_or_its_unknown_token():
    assert spelling_problem(array("i", [80, 604]), 0) is None
    assert spelling_problem(array("i", [80, 0]), 0) == UNKNOWN
    assert spelling_problem(array("i", [80, 0]), None) is None  # a vocabulary without an unknown token
    assert spelling_problem("the model's vocabulary has no token for U+03B1 α", 0).startswith("the model's")


@pytest.mark.model
@pytest.mark.timeout(180)
def test_a_choice_read_as_the_unknown_token_is_refused_from_the_job_and_from_a_record(tmp_path):
    """'<unk>' is TinyStories' unknown token: the job's list was refused for it, but a record's own
    choice went to the grammar unchecked (only the tokenizer process's refusals failed a record)."""
    model = require(TINYSTORIES, "TinyStories' SPM vocabulary, whose unknown token is '<unk>'")
    job = run(model, write_questions(tmp_path / "j.jsonl", 2), tmp_path / "j.out.jsonl", "dog,<unk>")
    assert job.returncode == 2, job.stderr
    assert job.stderr.strip().splitlines()[-1] == (f"ggbatch: error: answer.choices: '<unk>': {UNKNOWN}, so no "
                                                   "answer can be this choice")
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"questionID": qid, "question": "Once", "choices": choices}) + "\n"
                                 for qid, choices in (("u", ["dog", "<unk>"]), ("ok", ["dog", "cat"]))))
    out = tmp_path / "a.jsonl"
    r = run(model, questions, out, "auto")
    assert r.returncode == 1, r.stderr
    rows = {row["questionID"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["u"] == {"questionID": "u", "answer": None,
                         "error": f"its choice '<unk>' cannot be an answer: {UNKNOWN}"}
    assert rows["ok"]["answer"] in ("dog", "cat")


@pytest.mark.model
@pytest.mark.timeout(180)
def test_a_records_unknown_token_choice_fails_it_under_loglikelihood_scoring_too(tmp_path):
    """Scored as continuations, a record's own '<unk>' was scored as the unknown token and lost
    (rc 0, answered 'yes'); the job's same list was refused, and first_token scoring failed the record."""
    model = require(TINYSTORIES, "TinyStories' SPM vocabulary, whose unknown token is '<unk>'")
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"questionID": qid, "question": "Once", "choices": choices}) + "\n"
                                 for qid, choices in (("u", ["<unk>", "yes"]), ("ok", ["dog", "cat"]))))
    out = tmp_path / "a.jsonl"
    r = subprocess.run(ggbatch_cmd("run", "--model", model, "--input", questions, "--output", out, "--workers", 1,
                                   "--choices", "auto", "--choice-scoring", "loglikelihood", "--choice-logprobs"),
                       cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert r.returncode == 1, r.stderr
    rows = {row["questionID"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["u"] == {"questionID": "u", "answer": None,
                         "error": f"its choice '<unk>' cannot be an answer: {UNKNOWN}"}
    assert rows["ok"]["answer"] in ("dog", "cat")
    assert set(rows["ok"]["choice_logprobs"]) == {"dog", "cat"}
