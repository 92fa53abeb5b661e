"""A question that is a conversation: a record whose question field holds a list of messages
({role, content}, as chat datasets and OpenAI chat lines hold them) is rendered through the chat
template as an OpenAI Batch chat line's messages are, in a question file and from Python."""

import json

import pytest

import ggbatch
from ggbatch.runner.errors import InputError
from ggbatch.runner.files.inputs import read_records
from helpers import ggbatch as run_ggbatch

TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello"}, {"role": "user", "content": [{"type": "text", "text": "More"}]}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("question, message", [
    ([], "messages: must be a non-empty list of messages"),
    ([{"role": "bot", "content": "Hi"}],
     "messages[0].role: must be one of system, developer, user, assistant, got 'bot'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
     "messages[0].content[0]: only text parts are supported, got 'image_url'"),
    ([{"role": "user", "content": "Hi", "tool_calls": []}], "messages[0].tool_calls: not supported"),
    ({"role": "user"}, "'messages' must be a string or a conversation (a list of messages, each an object with a "
     "role and a content), got dict"),
    ([{"role": "user", "content": "Hi"}, "and more"], "'messages' must be a string or a conversation (a list of "
     "messages, each an object with a role and a content), got list holding str"),
])
def test_a_conversation_is_checked_as_the_file_is_read(tmp_path, question, message):
    path = write_jsonl(tmp_path / "q.jsonl", [{"questionID": "1", "messages": TURNS},
                                              {"questionID": "2", "messages": question}])
    with pytest.raises(InputError) as err:
        read_records(str(path), question_field="messages")
    assert str(err.value).startswith(f"{path}:2: {message}")


@pytest.mark.model
@pytest.mark.timeout(180)
def test_a_conversation_is_answered_as_the_same_chat_line_is(demo_model, tmp_path):
    """'messages' must be a string, got list: a chat dataset's rows could not be answered."""
    records = write_jsonl(tmp_path / "q.jsonl", [{"questionID": "c", "messages": TURNS},
                                                 {"questionID": "s", "messages": "Hi"}])
    chat = write_jsonl(tmp_path / "batch.jsonl", [{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
                                                   "body": {"messages": TURNS}}])
    flags = ["--model", demo_model, "--max-tokens", "12", "-q"]
    done = run_ggbatch("run", "--input", records, "--output", tmp_path / "a.jsonl", "--question-field", "messages",
                       *flags)
    assert done.returncode == 0, done.stderr
    lines = run_ggbatch("run", "--input", chat, "--output", tmp_path / "b.jsonl", *flags)
    assert lines.returncode == 0, lines.stderr
    answers = {row["questionID"]: row["answer"] for row in map(json.loads, (tmp_path / "a.jsonl").open())}
    line = json.loads((tmp_path / "b.jsonl").read_text())
    assert answers["c"] == line["response"]["body"]["choices"][0]["message"]["content"]
    called = ggbatch.answer([{"messages": TURNS}], model=demo_model, max_tokens=12, fields={"question": "messages"})
    given = ggbatch.answer([TURNS, "Hi"], model=demo_model, max_tokens=12)  # a conversation as one question
    assert called[0].text == given[0].text == answers["c"] and given[1].text == answers["s"]


@pytest.mark.model
@pytest.mark.timeout(180)
def test_a_conversation_whose_system_message_the_template_drops_fails_alone(demo_model, tmp_path):
    records = write_jsonl(tmp_path / "q.jsonl", [{"questionID": "sys", "messages": TURNS},
                                                 {"questionID": "user", "messages": TURNS[1:]}])
    users_only = "{% for m in messages %}{% if m.role == 'user' %}U: {{ m.content }}\n{% endif %}{% endfor %}A:"
    out = tmp_path / "a.jsonl"
    done = run_ggbatch("run", "--model", demo_model, "--input", records, "--output", out, "--question-field",
                       "messages", "--chat-template", users_only, "--max-tokens", "4", "-q")
    assert done.returncode == 1, done.stderr
    rows = {row["questionID"]: row for row in map(json.loads, out.open())}
    assert rows["sys"]["answer"] is None and rows["sys"]["error"].startswith(
        "messages: prompt.chat_template writes no system message, so this conversation's would be dropped")
    assert rows["user"]["answer"] and "error" not in rows["user"]
