import pytest

from ggbatch.runner.errors import ConfigError
from ggbatch.runner.questions.prompts import PromptBuilder, question_field_read

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_chat_template_with_system_prompt():
    b = PromptBuilder(CHATML, system="Be brief.")
    assert b.render("2+2?") == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                                "<|im_start|>assistant\n")


def test_plain_fallback():
    b = PromptBuilder(None, system="Answer concisely.")
    assert b.is_plain
    assert b.render("What is 2+2?") == "Answer concisely.\n\nQuestion: What is 2+2?\nAnswer:"
    assert PromptBuilder(None).render("Hi") == "Question: Hi\nAnswer:"


def test_user_template_over_record_fields():
    b = PromptBuilder(None, user_template="{{ question }}\nChoices: {{ choices | join(', ') }}")
    assert b.user_message({"question": "Pick", "choices": ["A", "B"]}) == "Pick\nChoices: A, B"
    assert PromptBuilder(None, question_field="prompt").user_message({"prompt": "x"}) == "x"


def test_bos_in_template_is_not_doubled():
    b = PromptBuilder("{{ bos_token }}{{ messages[0]['content'] }}", bos_token="<s>")
    prompt = b.render("hi")
    assert prompt == "<s>hi"
    assert not b.needs_bos(prompt)
    assert PromptBuilder(None, bos_token="<s>").needs_bos("Question: hi")


def test_template_exceptions_and_syntax_errors_are_config_errors():
    with pytest.raises(ConfigError, match="chat template: no system"):
        PromptBuilder("{% if messages %}{{ raise_exception('no system') }}{% endif %}").render("x")
    with pytest.raises(ConfigError, match="prompt.template: line 1"):
        PromptBuilder(None, user_template="{{ question ")


@pytest.mark.model
def test_real_model_templates_render(request):
    from conftest import MODELS, require
    from ggbatch.workers.llama.model_runner import Tokenizer

    # Phi-3's GGUF template writes no system message: a system prompt is refused with it (test_prompt_checks.py)
    for name, system in [("ggml-vocab-qwen2.gguf", "Be brief."), ("ggml-vocab-phi-3.gguf", None)]:
        tok = Tokenizer(str(require(MODELS / name, "real models' chat templates")))
        b = PromptBuilder(tok.chat_template, system=system, bos_token=tok.bos_text, eos_token=tok.eos_text)
        prompt = b.render("What is 2+2?")
        assert "What is 2+2?" in prompt
        tokens = tok.tokenize(prompt, add_bos=b.needs_bos(prompt))
        assert len(tokens) > 5
        tok.close()


def test_template_kwargs_reach_the_chat_template():
    t = "{{ messages[0]['content'] }}{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
    assert PromptBuilder(t, template_kwargs={"enable_thinking": False}).render("hi") == "hi/no_think"
    assert PromptBuilder(t).render("hi") == "hi"


def test_a_misspelt_field_is_an_error_naming_it():
    from ggbatch.runner.questions.prompts import TemplateFieldError

    b = PromptBuilder(None, user_template="Q: {{ questoin }}")
    with pytest.raises(TemplateFieldError) as err:
        b.user_message({"questionID": "q1", "question": "2+2?"})
    assert err.value.field == "questoin"
    # also inside a test, where the default Jinja would quietly take it as false
    with pytest.raises(TemplateFieldError):
        PromptBuilder(None, user_template="{% if hint %}{{ hint }}{% endif %}{{ question }}").user_message(
            {"question": "2+2?"})


def test_a_template_using_no_field_is_refused():
    with pytest.raises(ConfigError, match="uses no field of the record"):
        PromptBuilder(None, user_template="Answer the question.")


def test_a_conversation_renders_with_the_job_system_prompt_unless_it_has_its_own():
    b = PromptBuilder(CHATML, system="Be brief.")
    turns = (("user", "2+2?"), ("assistant", "4"), ("user", "3+3?"))
    assert b.render_messages(turns) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                                        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n"
                                        "<|im_start|>assistant\n")
    rendered = b.render_messages((("system", "Be kind."), ("user", "hi")))
    assert rendered.startswith("<|im_start|>system\nBe kind.<|im_end|>")
    assert b.render("hi") == b.render_messages((("user", "hi"),))


def test_a_template_refusing_a_conversation_is_a_chat_template_error():
    from ggbatch.runner.questions.prompts import ChatTemplateError

    strict = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('roles must alternate') }}{% endif %}{{ m.content }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="chat template: roles must alternate"):
        PromptBuilder(strict).render_messages((("user", "a"), ("user", "b")))


def test_a_last_message_left_open_ends_right_after_its_text():
    from ggbatch.runner.questions.prompts import ChatTemplateError

    b = PromptBuilder(CHATML)
    turns = (("user", "2+2?"), ("assistant", "The answer is "))
    # as transformers' continue_final_message: the text found and what closes it dropped, its
    # trailing space kept where the template wrote it
    assert b.render_messages(turns, continue_final=True) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\nThe answer is ")
    trims = "{% for m in messages %}<{{ m.content | trim }}>{% endfor %}"
    assert PromptBuilder(trims).render_messages((("user", " a b "),), continue_final=True) == "<a b"
    assert b.render_messages((("user", "hi"), ("assistant", "")), continue_final=True).endswith("<|im_end|>\n")
    upper = "{% for m in messages %}{{ m.content | upper }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="the last message's text does not appear"):
        PromptBuilder(upper).render_messages((("user", "hi"),), continue_final=True)


def test_the_fingerprint_changes_with_what_a_conversation_is_written_with():
    prints = {PromptBuilder(CHATML).fingerprint(), PromptBuilder(CHATML, system="Be brief.").fingerprint(),
              PromptBuilder(None).fingerprint(), PromptBuilder(CHATML, template_kwargs={"x": 1}).fingerprint()}
    assert len(prints) == 4 and PromptBuilder(CHATML).fingerprint() == PromptBuilder(CHATML).fingerprint()


def test_a_template_that_makes_the_prompt_from_other_fields_needs_no_question_field():
    assert question_field_read(None, "question") == "question"
    assert question_field_read("Q: {{ question }} ({{ subject }})", "question") == "question"
    assert question_field_read('{{ record["Prompt Text"] }}', "question") is None
    assert question_field_read("{{ passage }}\n{{ ask }}", "question") is None


def test_a_null_field_the_template_writes_is_an_error_and_one_it_tests_is_not():
    b = PromptBuilder(None, user_template="Q: {{ text }}")
    with pytest.raises(ConfigError, match=r"^prompt.template: it writes a null field \(JSON null"):
        b.user_message({"text": None})
    assert b.user_message({"text": ""}) == "Q: "  # an empty text is a text
    tested = PromptBuilder(None, user_template="Q: {% if ctx %}{{ ctx }} {% endif %}{{ text }}")
    assert tested.user_message({"text": "why?", "ctx": None}) == "Q: why?"
