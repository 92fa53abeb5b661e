"""A reasoning model's output that max_tokens cuts inside its thinking: it is thinking, never the
answer (answer "", the unfinished thinking as "thinking" / reasoning_content, as llama-server and
vLLM read a block that never closed); an answer held to choices, a schema or a grammar that was
cut before it was complete fails (answer null, an error, exit 1) rather than being written; a
budget that leaves no token for such an answer is refused before anything runs; a changed budget
is named down to 'reasoning.max_tokens', the key that sets it.

The models are the demo shape with a reasoning vocabulary (`ggbatch make-model --reasoning
think|harmony`): their templates open the block, and a random-weight model never closes it itself,
so it thinks until the budget's forced end or max_tokens."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ggbatch.runner.config.reasoning import answer_room_problem
from ggbatch.runner.files.formats.rows import Row, row_fields, shown_answer
from ggbatch.runner.journal.entries import answer_of, entry_of
from ggbatch.runner.journal.fingerprint import setting_change
from ggbatch.workers.protocol import Answer, FinishReason, Sample, Thinking
from helpers import ggbatch, journaled, write_jsonl

TEXTS = ["What is two and two?", "Tell me a story about a dog.", "Why is the sky blue?"]

# -- pure -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, thinking", [
    ("of part under", "of part under"),  # the template opened the block: no mark in the text
    ("<think>\nof part", "of part"),  # the model opened it
    ("<|channel|>analysis<|message|>side2n<|end|><|start|>assistant<|channel|>", "side2n"),  # cut in the switch
    ("sidengoo", "sidengoo"),
])
def test_an_output_that_ended_inside_its_thinking_is_thinking_and_no_answer(text, thinking):
    assert shown_answer(text, False, in_thinking=True) == (thinking, "")
    assert shown_answer("of part</think> B", False) == ("of part", "B")  # closed: as before


def test_row_fields_and_the_journal_keep_in_thinking_and_read_an_old_entry_as_closed():
    cut = Answer(qid="q1", text="of part", finish_reason=FinishReason.LENGTH, prompt_tokens=9, completion_tokens=8,
                 worker_id=0, in_thinking=True,
                 samples=(Sample("of part", FinishReason.LENGTH, 8, in_thinking=True),
                          Sample("x</think> y", FinishReason.STOP, 5)))
    entry = json.loads(json.dumps(entry_of(cut, "p", "r")))
    back = answer_of(entry)
    assert back.in_thinking and [s.in_thinking for s in back.samples] == [True, False]
    assert row_fields(Row("q1", back), "questionID", True) == {
        "questionID": "q1", "answer": ["", "y"], "thinking": ["of part", "x"]}
    old = {k: v for k, v in entry.items() if k not in ("in_thinking", "samples")}  # written before the key
    assert not answer_of(old).in_thinking
    assert row_fields(Row("q1", answer_of(old)), "questionID", True) == {"questionID": "q1", "answer": "of part"}


def test_a_budget_that_leaves_no_token_for_the_answer_is_named_with_its_keys():
    harmony = Thinking(start=(1, 2, 3), end=(1, 4, 3), forced=tuple(range(14)), header=True, budget=3)
    said = answer_room_problem(harmony, 17)
    assert said == ("max_tokens: 17: leaves no token for the answer after the thinking: reasoning.max_tokens (3) "
                    "+ the end of the thinking written for it (14 tokens) + one token of the answer need 18; "
                    "raise max_tokens or lower reasoning.max_tokens")
    assert answer_room_problem(harmony, 18) is None
    # gpt-oss's own template ends at <|start|>assistant: the model writes <|channel|>analysis<|message|> first
    assert answer_room_problem(harmony, 20, opened=False) == (
        "max_tokens: 20: leaves no token for the answer after the thinking: the opening of the thinking the model "
        "writes (3 tokens) + reasoning.max_tokens (3) + the end of the thinking written for it (14 tokens) + one "
        "token of the answer need 21; raise max_tokens or lower reasoning.max_tokens")
    assert answer_room_problem(harmony, 21, opened=False) is None
    assert answer_room_problem(Thinking((1,), (2,), (2,)), 1) is None  # no budget: nothing to add up


def test_a_changed_setting_is_named_down_to_the_key_that_differs():
    block = {"start": [756], "end": [757], "forced": [757], "budget": 3, "header": False, "blank": [13, 259]}
    assert setting_change({"reasoning": block, "max_tokens": 8}, {"reasoning": {**block, "budget": 5},
                                                                  "max_tokens": 8}) == ("reasoning.max_tokens", 3, 5)
    assert setting_change({"answer": None}, {"answer": {"choices": ["A"]}}) == ("answer", None, {"choices": ["A"]})
    assert setting_change({"sampling.n": 4}, {}) == ("sampling.n", 4, 1)  # left out at its default


# -- real llama.cpp -------------------------------------------------------------------------------


def _questions(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "q.jsonl", [{"questionID": f"q{i}", "question": t} for i, t in enumerate(TEXTS)])


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_plain_answer_cut_inside_the_thinking_is_thinking_in_every_format(think_model, tmp_path):
    questions = _questions(tmp_path)
    out = tmp_path / "a.jsonl"
    run = ("run", "--model", think_model, "--input", questions, "--max-tokens", 6, "--keep-thinking", "-q")
    done = ggbatch(*run, "--output", out)
    assert done.returncode == 0, done.stderr
    rows = _rows(out)
    assert all(r["answer"] == "" and r["thinking"] for r in rows), rows
    assert all(e.get("in_thinking") for e in journaled(tmp_path / "a.jsonl.journal.jsonl"))
    again = ggbatch(*run, "--output", out)  # every answer from the journal: the same file
    assert again.returncode == 0 and _rows(out) == rows
    done = ggbatch(*run, "--output", tmp_path / "a.csv")
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "a.csv", newline="") as f:
        assert [(r["answer"], r["thinking"]) for r in csv.DictReader(f)] == [("", r["thinking"]) for r in rows]
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": t}], "max_tokens": 6}} for i, t in enumerate(TEXTS)]
    oa = tmp_path / "o.jsonl"
    done = ggbatch("run", "--model", think_model, "--input", write_jsonl(tmp_path / "b.jsonl", lines), "--output",
                   oa, "-q")
    assert done.returncode == 0, done.stderr
    for line, row in zip(_rows(oa), rows):
        choice = line["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"] == "" and choice["message"]["reasoning_content"] == row["thinking"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_choices_cut_inside_the_thinking_fail_and_the_log_names_the_first(think_model, harmony_model, tmp_path):
    questions = _questions(tmp_path)
    report = tmp_path / "r.json"
    for model, max_tokens in ((think_model, 4), (harmony_model, 8)):  # no budget: it thinks until cut
        out = tmp_path / f"{Path(model).stem}.jsonl"
        done = ggbatch("run", "--model", model, "--input", questions, "--output", out, "--max-tokens", max_tokens,
                       "--choices", "A,B", "--keep-thinking", "--report", report)
        assert done.returncode == 1, done.stderr
        for row in _rows(out):
            assert row["answer"] is None and "thinking" not in row
            assert row["error"] == (f"max_tokens ({max_tokens}) ran out while the model was thinking, before its "
                                    "answer (which must be one of the choices): raise max_tokens or set a thinking "
                                    "budget below it")
        assert ("3 answers held to choices or a grammar were cut before they were complete and failed (first: q0: "
                f"max_tokens ({max_tokens}) ran out while the model was thinking" in done.stderr)
        said = json.loads(report.read_text())["questions"]
        assert (said["answered"], said["failed"], said["finish_reasons"]) == (0, 3, {"length": 3})


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_budget_with_no_room_for_the_answer_is_refused_and_one_with_room_answers(harmony_model, tmp_path):
    questions = _questions(tmp_path)
    out = tmp_path / "h.jsonl"
    run = ("run", "--model", harmony_model, "--input", questions, "--output", out, "--thinking-budget", 3,
           "--choices", "A,B", "-q")
    refused = ggbatch(*run, "--max-tokens", 17)
    assert refused.returncode == 2 and not out.exists()
    assert refused.stderr.strip().splitlines() == [
        "ggbatch: error: max_tokens: 17: leaves no token for the answer after the thinking: reasoning.max_tokens "
        "(3) + the end of the thinking written for it (14 tokens) + one token of the answer need 18; raise "
        "max_tokens or lower reasoning.max_tokens"]
    done = ggbatch(*run, "--max-tokens", 18)  # exactly the room: the choice is the last token
    assert done.returncode == 0, done.stderr
    assert all(r["answer"] in ("A", "B") for r in _rows(out))
    # a template that leaves the channel to the model (gpt-oss's own): its opening needs room too
    own = "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant"
    refused = ggbatch(*run, "--max-tokens", 18, "--chat-template", own)
    assert refused.returncode == 2 and "the opening of the thinking the model writes (8 tokens)" in refused.stderr


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_grammar_cut_before_it_is_complete_fails_and_one_complete_at_the_limit_answers(think_model, tmp_path):
    questions = _questions(tmp_path)
    base = ("run", "--model", think_model, "--input", questions, "--thinking-budget", 2, "--max-tokens", 4, "-q")
    whole = ggbatch(*base, "--output", tmp_path / "x.jsonl", "--grammar", 'root ::= "x"')
    assert whole.returncode == 0, whole.stderr  # 2 thinking, </think>, then "x" as the 4th token
    assert [r["answer"] for r in _rows(tmp_path / "x.jsonl")] == ["x"] * 3
    cut = ggbatch(*base, "--output", tmp_path / "j.jsonl", "--json-schema", '{"type": "object"}')
    assert cut.returncode == 1, cut.stderr
    for row in _rows(tmp_path / "j.jsonl"):
        assert row["answer"] is None
        assert row["error"] == ("max_tokens (4) ran out before the answer was complete (it must be complete under "
                                "its grammar): raise max_tokens")


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rerun_with_another_budget_names_reasoning_max_tokens(think_model, tmp_path):
    run = ("run", "--model", think_model, "--input", _questions(tmp_path), "--output", tmp_path / "a.jsonl",
           "--max-tokens", 8, "-q")
    assert ggbatch(*run, "--thinking-budget", 3).returncode == 0
    other = ggbatch(*run, "--thinking-budget", 5)
    assert other.returncode == 2
    assert "'reasoning.max_tokens' changed since the journaled run (3 -> 5); run with --fresh" in other.stderr


@pytest.mark.model
@pytest.mark.timeout(300)
def test_choices_scored_by_log_likelihood_take_a_budget_of_0_and_refuse_one_above(think_model, tmp_path):
    """Nothing is generated for a scored choice, so nothing is thought before it: max_tokens is no
    reason to refuse a budget of 0, and a budget above it asks for thinking that never comes."""
    out = tmp_path / "ll.jsonl"
    run = ("run", "--model", think_model, "--input", _questions(tmp_path), "--output", out, "--choices", "A,B",
           "--choice-scoring", "loglikelihood", "--max-tokens", 1, "-q")
    done = ggbatch(*run, "--thinking-budget", 0)
    assert done.returncode == 0, done.stderr
    assert all(row["answer"] in ("A", "B") for row in _rows(out))
    refused = ggbatch(*run, "--thinking-budget", 512)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "ggbatch: error: reasoning.max_tokens: 512 with answer.choice_scoring: loglikelihood: each choice is scored "
        "as the answer after an empty thinking block, and no thinking is generated; leave the budget out (or 0), "
        "or let the model think first with answer.choice_scoring: first_token"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_line_whose_effort_leaves_no_room_for_its_schema_gets_a_400_with_the_numbers(harmony_model, tmp_path):
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}

    def line(cid: str, max_tokens: int, effort: str) -> dict:
        return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "Q: pick"}], "max_tokens": max_tokens,
                         "reasoning_effort": effort, "response_format": schema}}

    out = tmp_path / "o.jsonl"
    done = ggbatch("run", "--model", harmony_model, "--output", out, "-q", "--input",
                   write_jsonl(tmp_path / "in.jsonl", [line("none", 3, "none"), line("minimal", 40, "minimal"),
                                                       line("room", 40, "none")]))
    assert done.returncode == 1, done.stderr
    bodies = {r["custom_id"]: r["response"]["body"] for r in _rows(out)}
    assert bodies["none"]["error"]["message"] == (
        "body.max_tokens: 3: leaves no token for the answer after the thinking: the thinking budget of "
        "body.reasoning_effort 'none' (0) + the end of the thinking written for it (14 tokens) + one token of the "
        "answer need 15; raise body.max_tokens")
    assert bodies["minimal"]["error"]["message"].endswith(
        "need 143; raise body.max_tokens or lower the thinking budget of body.reasoning_effort 'minimal'")
    assert "error" not in bodies["room"]  # room for the end and the answer: it is answered


def _chat_line(cid: str, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Q: pick"}], **body}}


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lines_effort_over_the_jobs_budget_gets_the_room_of_the_jobs_max_tokens(think_model, tmp_path):
    """The job's max_tokens is cut to its own budget's room and its choices (5 tokens at budget
    0); a line's reasoning_effort 'minimal' (128) was refused against that 5 although the job
    asked 300: a budget of its own is sized from what the job asked."""
    out = tmp_path / "o.jsonl"
    done = ggbatch("run", "--model", think_model, "--output", out, "-q", "--max-tokens", 300, "--choices", "A,B,C,D",
                   "--thinking-budget", 0, "--input",
                   write_jsonl(tmp_path / "in.jsonl", [_chat_line("minimal", reasoning_effort="minimal"),
                                                       _chat_line("job")]))
    assert done.returncode == 0, done.stderr
    content = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in _rows(out)}
    assert content["minimal"] in ("A", "B", "C", "D") and content["job"] in ("A", "B", "C", "D")


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_in_a_scoring_job_a_line_held_to_its_own_schema_is_generated_and_checked_as_one(harmony_model, tmp_path):
    """Choices scored by log-likelihood generate nothing, but a line with its own response_format
    is generated under it: its reasoning_effort applies, and its room is checked."""
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
    lines = [_chat_line("minimal", reasoning_effort="minimal", max_tokens=200, response_format=schema),
             _chat_line("short", reasoning_effort="none", max_tokens=1, response_format=schema),
             _chat_line("scored", reasoning_effort="low")]
    out = tmp_path / "o.jsonl"
    done = ggbatch("run", "--model", harmony_model, "--output", out, "-q", "--choices", "A,B,C,D", "--choice-scoring",
                   "loglikelihood", "--input", write_jsonl(tmp_path / "in.jsonl", lines))
    assert done.returncode == 1, done.stderr
    bodies = {r["custom_id"]: r["response"]["body"] for r in _rows(out)}
    assert isinstance(json.loads(bodies["minimal"]["choices"][0]["message"]["content"])["x"], int)
    assert bodies["short"]["error"]["message"].startswith("body.max_tokens: 1: leaves no token for the answer")
    assert "only 'none' applies" in bodies["scored"]["error"]["message"]
