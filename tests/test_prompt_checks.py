"""What a job's prompt settings are refused for, and how a template's failure is said: a chat
template that reads no messages, template_kwargs that ggbatch sets itself, a template's Python
error, a system prompt the chat template drops, and a record's field named `record` or lacking
a key the template reads (runner/questions/prompts.py)."""

import json

import pytest

from ggbatch.runner.errors import ConfigError
from ggbatch.runner.questions.maker import _user_message
from ggbatch.runner.questions.prompts import ChatTemplateError, PromptBuilder, check_templates
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


def test_a_python_error_in_a_template_is_said_as_its_record_and_key():
    builder = PromptBuilder(None, user_template="{{ question }} times {{ n + 1 }}")
    with pytest.raises(ConfigError) as err:
        _user_message(builder, Rec({"question": "Once", "n": "3"}), "qt.jsonl:1")
    assert str(err.value) == "qt.jsonl:1: record 'q1': prompt.template: can only concatenate str (not \"int\") to str"
    chat = PromptBuilder("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", template_key="prompt.chat_template")
    with pytest.raises(ChatTemplateError, match=r"^prompt.chat_template: can only concatenate str"):
        chat.render("x")


@pytest.mark.timeout(300)
def test_a_python_error_ends_the_run_in_one_line_and_fails_only_its_batch_line(tmp_path, demo_model):
    questions = write_jsonl(tmp_path / "qt.jsonl", [{"questionID": "q1", "question": "Once", "n": "3"}])
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "o.jsonl",
                "--max-tokens", 2, "--workers", 1, "--template", "{{ question }} times {{ n + 1 }}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"ggbatch: error: {questions}:1: record 'q1': prompt.template: can only concatenate "
                                "str (not \"int\") to str")
    # a conversation of one-letter messages divides by zero in this template: that line alone fails
    divides = "{% for m in messages %}{{ m.content }}{{ 10 // (m.content | length - 1) }}{% endfor %}"
    batch = write_jsonl(tmp_path / "b.jsonl", [chat_line("bad", ("user", "x")), chat_line("good", ("user", "Once"))])
    out = tmp_path / "b_out.jsonl"
    r = ggbatch("run", "--model", demo_model, "--input", batch, "--output", out, "--workers", 1,
                "--chat-template", divides)
    lines = lines_of(out)
    assert lines["bad"]["response"]["status_code"] == 400, lines
    assert "body.messages: prompt.chat_template: integer division or modulo by zero" in json.dumps(lines["bad"])
    assert lines["good"]["response"]["status_code"] == 200, (r.stderr, lines)


def test_a_system_prompt_the_chat_template_drops_is_refused_naming_system():
    with pytest.raises(ConfigError, match=r"^system: the prompt.chat_template writes no system message"):
        PromptBuilder(NO_SYSTEM, system="You are a pirate.", template_key="prompt.chat_template")
    with pytest.raises(ConfigError, match=r"^system: the prompt.chat_template writes no system message"):
        check_templates(None, NO_SYSTEM, "You are a pirate.")  # a warm pool refuses it as it starts
    assert PromptBuilder(NO_SYSTEM).render("hi") == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    assert PromptBuilder(None, system=" Be brief. ").render("hi").startswith(" Be brief. \n")  # the plain template
    # an OpenAI Batch line's own system message: that line is refused, not answered without it
    builder = PromptBuilder(NO_SYSTEM, template_key="prompt.chat_template")
    assert builder.system_problem((("system", "Be brief."), ("user", "hi"))) == (
        "prompt.chat_template writes no system message, so this conversation's would be dropped")
    assert builder.system_problem((("user", "hi"),)) is None
    # a template that refuses a system message (Gemma's): the job's system prompt is refused at
    # once, in the template's own words, not as every question fails; a batch line's fails alone
    refuses = "{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}{% endif %}" + NO_SYSTEM
    with pytest.raises(ConfigError, match=r"^system: the prompt.chat_template refuses a system message "
                                          r"\(no system role\), so every question would fail"):
        check_templates(None, refuses, "Be brief.")
    builder = PromptBuilder(refuses, template_key="prompt.chat_template")
    assert builder.render("hi") == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    with pytest.raises(ChatTemplateError, match="no system role"):
        builder.render_messages((("system", "Be brief."), ("user", "hi")))


@pytest.mark.timeout(300)
def test_a_run_refuses_a_system_prompt_its_template_drops_and_a_batch_line_holding_one(tmp_path, demo_model):
    questions = write_jsonl(tmp_path / "q.jsonl", [{"questionID": "a", "question": "2+2?"}])
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "o.jsonl",
                "--max-tokens", 2, "--workers", 1, "--chat-template", NO_SYSTEM, "--system", "You are a pirate.")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith("ggbatch: error: system: the prompt.chat_template writes no system message")
    batch = write_jsonl(tmp_path / "b.jsonl", [chat_line("sys", ("system", "Be a pirate."), ("user", "2+2?")),
                                               chat_line("plain", ("user", "2+2?"))])
    out = tmp_path / "b_out.jsonl"
    r = ggbatch("run", "--model", demo_model, "--input", batch, "--output", out, "--workers", 1,
                "--chat-template", NO_SYSTEM)
    lines = lines_of(out)
    assert lines["sys"]["response"]["status_code"] == 400 and "writes no system message" in json.dumps(lines["sys"])
    assert lines["plain"]["response"]["status_code"] == 200, (r.stderr, lines)


def test_record_is_the_whole_record_even_beside_a_field_of_that_name():
    builder = PromptBuilder(None, user_template='{{ record["Prompt Text"] }} ({{ record.record }})')
    assert builder.user_message({"Prompt Text": "real question", "record": "row 7"}) == "real question (row 7)"


def test_a_missing_key_inside_a_field_is_said_as_that_fields():
    builder = PromptBuilder(None, user_template="{{ question }} ({{ meta.source }})")
    with pytest.raises(ConfigError) as err:
        _user_message(builder, Rec({"question": "q?", "meta": {"src": "x"}}), "f.jsonl:1")
    assert str(err.value) == "f.jsonl:1: record 'q1': prompt.template: field 'meta' has no key 'source'"
    # a field the record lacks is still said with the record's fields, by name or through record[...]
    for template in ("{{ question }} {{ topic }}", '{{ question }} {{ record["topic"] }}'):
        with pytest.raises(ConfigError) as err:
            _user_message(PromptBuilder(None, user_template=template), Rec({"question": "q?"}), "f.jsonl:1")
        assert str(err.value) == ("f.jsonl:1: record 'q1' has no field 'topic' that prompt.template uses "
                                  "(its fields: 'question')")


def test_an_empty_prompt_template_is_refused_as_a_template_using_no_field():
    with pytest.raises(ConfigError, match="^prompt.template uses no field of the record"):
        PromptBuilder(None, user_template="")
    with pytest.raises(ConfigError, match="^prompt.template uses no field of the record"):
        check_templates("", None)  # as a warm pool refuses it
