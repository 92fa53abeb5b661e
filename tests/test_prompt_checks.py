"""What a job's prompt settings are refused for, and how a template's failure is said: a chat
template that reads no messages, template_kwargs that ggbatch sets itself, a template's Python
error, a system prompt the chat template drops, and a record's field named `record` or lacking
a key the template reads (runner/questions/prompts.py)."""

import json

import pytest

from ggbatch.runner.errors import ConfigError
from ggbatch.runner.questions.prompts import PromptBuilder, check_templates
from helpers import ggbatch, write_jsonl

# Phi-3's GGUF template: a user and an assistant branch, no system one
NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'user' %}<|user|>\n{{ m.content }}<|end|>\n"
             "{% elif m.role == 'assistant' %}<|assistant|>\n{{ m.content }}<|end|>\n{% endif %}{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


class Rec:
    """What _user_message reads of a record."""

    def __init__(self, fields, qid="q1"):
        self.fields, self.qid = fields, qid


def chat_line(cid, *turns):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "max_tokens": 2, "messages": [{"role": r, "content": c} for r, c in turns]}}


def lines_of(out):
    return {row["custom_id"]: row for row in map(json.loads, out.read_text().splitlines())}


def test_a_chat_template_reading_no_messages_is_refused_naming_its_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^prompt.chat_template reads no messages, so every question would get "
                                          r"the same prompt: 'none'$"):
        PromptBuilder("none", template_key="prompt.chat_template")
    on_disk = tmp_path / "chat"
    on_disk.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    for path in (str(on_disk), "templates/chat.jinja", "my.j2"):  # a file's name: the file is not read
        with pytest.raises(ConfigError, match=r"\(a path is not read: give the template's text\)$"):
            check_templates(None, path)
    assert PromptBuilder("{{ messages[0].content }}!").render("hi") == "hi!"


@pytest.mark.timeout(300)
def test_a_run_with_a_chat_template_file_name_stops_before_answering(tmp_path, demo_model):
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}<|user|>{{ m.content }}{% endfor %}<|assistant|>")
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": f"q{i}", "question": f"Q{i}?"} for i in range(3)])
    out = tmp_path / "o.jsonl"
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", out, "--max-tokens", 2,
                "--workers", 1, "--chat-template", tmp_path / "chat.jinja")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("ggbatch: error: prompt.chat_template reads no messages")
    assert "a path is not read" in r.stderr and not out.exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["add_generation_prompt", "bos_token", "messages"])
def test_template_kwargs_ggbatch_sets_itself_are_refused_with_the_job(tmp_path, name):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: m.gguf\ninput: q.jsonl\noutput: o.jsonl\nprompt:\n  template_kwargs: {{{name}: false}}\n")
    r = ggbatch("run", job)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"ggbatch: error: {job}: prompt.template_kwargs: must not set {name}: ggbatch sets it "
                               "for every prompt"), r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.glob("o.jsonl*"))
