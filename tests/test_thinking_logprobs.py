"""Token log-probabilities of a reasoning model's answer (answer.token_logprobs, an OpenAI chat
line's logprobs.content) cover the answer's own tokens: not the thinking block, nor the end of it
ggbatch wrote when the budget ran out, whether or not the thinking is kept. A /v1/completions
line's text keeps the thinking, and so do its entries.

The models are the demo model's shape with a reasoning vocabulary (`make-model --reasoning
think|harmony`): random weights, so every end of the thinking is the budget's forced one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggbatch.runner.files.formats.rows import answer_logprobs
from ggbatch.workers.protocol import TokenLogprob
from helpers import ggbatch, write_jsonl


def _entries(*pieces: bytes) -> list[TokenLogprob]:
    return [TokenLogprob(i, p, -0.5 * i) for i, p in enumerate(pieces)]


def _tokens(text: str, entries: list[TokenLogprob], in_thinking: bool = False) -> list[str]:
    return [e["token"] for e in answer_logprobs(text, entries, in_thinking)]


def test_the_entries_start_after_the_thinking_block_as_the_answer_does():
    think = _entries(b"<think>", b"a", b" b", b"</think>", b"\n\n", b"Paris")
    assert _tokens("<think>a b</think>\n\nParis", think) == ["\n\n", "Paris"]
    # a block the chat template opened: only its end is in the output
    assert _tokens("a b</think> Paris", _entries(b"a", b" b", b"</think>", b" Paris")) == [" Paris"]
    # cut inside the thinking: all of it thinking, no answer, no entries
    assert _tokens("a b c", _entries(b"a", b" b", b" c"), in_thinking=True) == []
    # a token running from the thinking's end into the answer spells part of it: kept whole
    assert _tokens("a</think>Hi", _entries(b"a", b"</think>H", b"i")) == ["</think>H", "i"]
    # the answer's first character in byte tokens: all of them (U+65E5 is E6 97 A5)
    assert len(_tokens("a</think>\u65e5", _entries(b"a", b"</think>", b"\xe6", b"\x97", b"\xa5"))) == 3
    # no thinking at all: every token, as before
    assert _tokens(" Paris is", _entries(b" Paris", b" is")) == [" Paris", " is"]


def test_a_harmony_answer_is_the_final_channels_message():
    pieces = (b"<|channel|>", b"analysis", b"<|message|>", b"hm", b"<|end|>", b"<|start|>", b"assistant",
              b"<|channel|>", b"final", b"<|message|>", b"Hi", b" there", b"<|end|>")
    text = b"".join(pieces).decode()
    assert _tokens(text, _entries(*pieces)) == ["Hi", " there"]


def _run(model: str, tmp_path: Path, *extra: object) -> list[dict]:
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": f"q{i}", "question": q} for i, q in
                                                   enumerate(("What is 2+2?", "Name a colour.", "Say hi."))])
    out = tmp_path / "a.jsonl"
    done = ggbatch("run", "--model", model, "--input", questions, "--output", out, "--thinking-budget", 3,
                   "--token-logprobs", 2, "-q", *extra)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def _spelt(entries: list[dict]) -> str:
    return bytes(b for e in entries for b in e["bytes"]).decode("utf-8", errors="replace")


@pytest.mark.model
@pytest.mark.timeout(300)
@pytest.mark.parametrize("keep", [False, True])
def test_run_answers_entries_spell_the_answer_and_not_the_thinking(think_model, tmp_path, keep):
    rows = _run(think_model, tmp_path, "--max-tokens", 9, *(["--keep-thinking"] if keep else []))
    for row in rows:
        assert row["answer"] and _spelt(row["token_logprobs"]).strip() == row["answer"], row
        assert "</think>" not in [e["token"] for e in row["token_logprobs"]]
        assert len(row["token_logprobs"]) < 9  # 3 thinking tokens and the forced end are left out
        assert ("thinking" in row) is keep


@pytest.mark.model
@pytest.mark.timeout(300)
def test_harmony_entries_spell_the_final_channel(harmony_model, tmp_path):
    for row in _run(harmony_model, tmp_path, "--max-tokens", 30):
        assert row["answer"] and _spelt(row["token_logprobs"]).strip() == row["answer"], row


@pytest.mark.model
@pytest.mark.timeout(300)
def test_openai_lines_content_entries_spell_content_and_a_completions_entries_its_text(think_model, tmp_path):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "logprobs": True, "n": 2,
            "temperature": 1.0, "seed": 1}
    lines = [{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": chat},
             {"custom_id": "text", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "<think>", "max_tokens": 9, "logprobs": 0}}]
    out = tmp_path / "out.jsonl"
    done = ggbatch("run", "--model", think_model, "--input", write_jsonl(tmp_path / "in.jsonl", lines),
                   "--output", out, "--thinking-budget", 3, "-q")
    assert done.returncode == 0, done.stderr
    bodies = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, out.read_text().splitlines())}
    for choice in bodies["chat"]["choices"]:
        message = choice["message"]
        assert message["reasoning_content"] and message["content"]
        assert _spelt(choice["logprobs"]["content"]).strip() == message["content"]
    completion = bodies["text"]["choices"][0]
    assert "</think>" in completion["text"] and "".join(completion["logprobs"]["tokens"]) == completion["text"]


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_choice_answered_after_thinking_has_its_own_entry(think_model, tmp_path):
    """A choice read from the logits after the thinking block: its one entry, with the
    log-probability its choice_logprobs says (the thinking's entries are left out)."""
    for row in _run(think_model, tmp_path, "--max-tokens", 9, "--choices", "A,B", "--choice-logprobs"):
        assert row["answer"] in ("A", "B"), row
        (entry,) = row["token_logprobs"]
        assert entry["token"] == row["answer"] and entry["logprob"] == row["choice_logprobs"][row["answer"]], row


@pytest.mark.model
@pytest.mark.timeout(300)
def test_stop_strings_apply_to_the_answer_not_the_block_or_the_end_ggbatch_writes(think_model, harmony_model,
                                                                                  tmp_path):
    """A stop string inside the end of the thinking that ggbatch writes when the budget is spent
    (`</think>`; harmony's `<|end|><|start|>assistant<|channel|>final<|message|>`) ends nothing:
    the answer comes, and ends at the stop string's first place in the answer itself."""
    for model, stop in ((think_model, "/"), (harmony_model, "e")):
        (folder := tmp_path / stop.replace("/", "slash")).mkdir()
        rows = _run(model, folder, "--max-tokens", 24, "--thinking-budget", 0, "--stop", stop)
        assert all(row["answer"] and "<" not in row["answer"] and stop not in row["answer"] for row in rows), rows
