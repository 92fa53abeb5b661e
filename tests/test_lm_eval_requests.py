"""What ggbatch's lm-eval model makes of lm-eval's requests and model_args
(runner/tools/lm_eval_requests.py, package/lm_eval.py): generation kwargs by lm-eval's own rule
(its normalize_gen_kwargs), the model_args it refuses and what it suggests, --device. The checks
without a model first, then on ../shared's stories260K."""

import re

import pytest

import ggbatch
from ggbatch.runner.tools.lm_eval_requests import check_model_args, generation_of


def test_lm_evals_aliases_of_max_gen_toks_are_taken_by_its_priority(caplog):
    for alias in ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens"):
        assert generation_of({alias: 5}).max_tokens == 5, alias
    assert generation_of({}).max_tokens == 256  # lm-eval's default
    with caplog.at_level("WARNING", logger="ggbatch"):
        assert generation_of({"max_completion_tokens": 9, "max_tokens": 7, "max_new_tokens": 3}).max_tokens == 3
        assert generation_of({"max_completion_tokens": 9, "max_tokens": 7, "max_new_tokens": 3}).max_tokens == 3
        assert generation_of({"max_tokens": 7, "max_gen_toks": 2}).max_tokens == 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "max_new_tokens is used" in said[0] and "max_gen_toks is used" in said[1]
    assert not any("not used" in line for line in said)  # none of them is said to be dropped
    with pytest.raises(ggbatch.GgbatchError, match="generation_kwargs max_new_tokens must be a whole number"):
        generation_of({"max_new_tokens": "many"}, "task 'x' doc 1")


@pytest.mark.parametrize("kwargs", [
    {"max_new_tokens": 5}, {"max_tokens": 5, "max_completion_tokens": 8}, {"temperature": 0.8},
    {"until": "\n", "max_gen_toks": 3, "temperature": 0.5, "top_p": 0.9},
    {"do_sample": True, "temperature": 0.8}, {"do_sample": False, "temperature": 0.8}, {"temperature": 0.0},
])
def test_generation_kwargs_follow_lm_evals_own_models(kwargs):
    """ggbatch mirrors lm-eval's normalize_gen_kwargs: the same max_gen_toks, until and choice of
    greedy or sampling (temperature 0) as the installed lm-eval's models make."""
    utils = pytest.importorskip("lm_eval.models.utils")
    if not hasattr(utils, "normalize_gen_kwargs"):
        pytest.skip("this lm-eval has no normalize_gen_kwargs")
    theirs, ours = utils.normalize_gen_kwargs(dict(kwargs)), generation_of(dict(kwargs))
    assert ours.max_tokens == theirs["max_gen_toks"] and list(ours.stop) == theirs["until"]
    sampled = bool(theirs["do_sample"]) and float(theirs.get("temperature", 0.0)) > 0
    assert ours.sampling.temperature == (float(theirs["temperature"]) if sampled else 0.0)


def test_a_temperature_without_do_sample_samples_with_no_top_k_unless_the_task_gives_one():
    """--gen_kwargs temperature=0.8 (a pass@k run) samples, as lm-eval's models do; a sampled
    request gets no top-k the task did not ask for (ggbatch's job default, 40, is not lm-eval's)."""
    alone = generation_of({"temperature": 0.8}).sampling
    assert (alone.temperature, alone.top_k, alone.top_p, alone.min_p) == (0.8, 0, 1.0, 0.0)
    assert generation_of({"do_sample": True, "temperature": 0.8}).sampling.top_k == 0
    assert generation_of({"temperature": 0.8, "top_k": 20}).sampling.top_k == 20
    assert generation_of({"do_sample": False, "temperature": 0.8}).sampling.temperature == 0.0
    assert generation_of({"do_sample": True}).sampling.temperature == 0.0  # temperature 0: greedy


@pytest.mark.parametrize("setting, shown", [
    ({"prompt.template": "Q: {{ question }}"}, "prompt.template"), ({"prompt__template": "{{ question }}"},
                                                                    "prompt__template"),
    ({"prompt": {"template": "{{ question }}", "chat_template": "{{ messages }}"}}, "prompt.template"),
])
def test_prompt_template_in_model_args_is_refused_as_the_task_writes_the_requests(setting, shown):
    """lm-eval's requests come as text its task wrote: ggbatch's prompt.template would do nothing."""
    with pytest.raises(ggbatch.GgbatchError, match=rf"^ggbatch.lm_eval model_args: {shown} is not used: lm-eval's "
                       r"requests decide it, through the task's doc_to_text"):
        check_model_args(setting)
    check_model_args({"prompt.chat_template": "{{ messages }}", "system": "Be brief."})  # --apply_chat_template's


@pytest.mark.parametrize("typo", ["add_bos_token", "max_tokns", "temprature", "stp", "reasoning_budget", "top_kk",
                                  "wokers", "n_gpu_layers", "seed", "chat_template", "system_prompt", "slot"])
def test_an_unknown_model_arg_is_pointed_only_at_a_key_model_args_takes(typo):
    """The "did you mean" of an unknown key is a key the same check takes: add_bos_token (Hugging
    Face's model_arg) was pointed at reasoning.max_tokens, which it then refused."""
    with pytest.raises(ggbatch.GgbatchError, match=rf"^ggbatch.lm_eval model_args: unknown key '{typo}'") as raised:
        check_model_args({typo: 1})
    hint = re.search(r"did you mean '([^']+)'", str(raised.value))
    if hint:
        check_model_args({hint.group(1): 1})  # taken, not refused
    assert "reasoning" not in (hint.group(1) if hint else "")


def test_the_model_args_hint_still_names_the_key_meant():
    for typo, meant in [("wokers", "workers"), ("n_gpu_layers", "model.n_gpu_layers"), ("seed", "sampling.seed"),
                        ("max_lenght", "max_length"), ("system_prompt", "system")]:
        with pytest.raises(ggbatch.GgbatchError, match=rf"unknown key '{typo}' \(did you mean '{meant}'\?\)"):
            check_model_args({typo: 1})


# -- on real models ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_bos_model(tmp_path_factory):
    """qwen3-tiny on Qwen2's vocabulary: a model whose tokenizer adds no BOS."""
    from conftest import MODELS, require
    from ggbatch.runner.model.make import modelgen as mg

    vocab = require(MODELS / "ggml-vocab-qwen2.gguf", "Qwen2's vocabulary")
    return str(mg.make_model(tmp_path_factory.mktemp("qwen") / "qwen.gguf", "qwen3-tiny", vocab=str(vocab),
                             ftype="f16"))


@pytest.mark.timeout(300)
@pytest.mark.model
def test_a_whitespace_context_on_a_model_without_bos_is_scored_as_the_empty_one(no_bos_model):
    """A context of whitespace alone ('\\n' before a passage) is empty once its whitespace moves to
    the continuation: on a model without BOS it was a prompt of no tokens, and ended the run."""
    instance = pytest.importorskip("lm_eval.api.instance")
    from ggbatch.lm_eval import GgbatchLM

    lm = GgbatchLM(model=no_bos_model, workers=1, threads=1)
    try:
        assert lm.tok_encode("") == []  # no BOS: the empty text is no token
        pairs = [("\n", "Hello world"), (" ", "Hello"), ("", "\nHello world"), ("Hi", " there")]
        scored = lm.loglikelihood([instance.Instance("loglikelihood", {}, pair, 0) for pair in pairs],
                                  disable_tqdm=True)
        # the whitespace context is the empty one, its whitespace the continuation's start
        assert scored[0] == pytest.approx(scored[2], abs=1e-6)
        assert all(logprob < 0 for logprob, _ in scored)
    finally:
        lm.pool.close()


@pytest.mark.timeout(180)
@pytest.mark.model
def test_system_without_the_chat_template_is_refused_at_the_first_request():
    """`system` (and the chat template's other settings) only write lm-eval's --apply_chat_template
    conversations: in requests written without it they would do nothing, so the first request
    call says so, with what does apply (--system_instruction)."""
    instance = pytest.importorskip("lm_eval.api.instance")
    from conftest import STORIES, require
    from ggbatch.lm_eval import GgbatchLM

    lm = GgbatchLM(model=str(require(STORIES, "stories260K")), workers=1, threads=1, system="Be brief.")
    try:
        request = instance.Instance("loglikelihood", {}, ("Once upon a time", " there"), 0)
        with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.lm_eval model_args: system applies only to "
                           r"lm-eval's --apply_chat_template .*--system_instruction"):
            lm.loglikelihood([request], disable_tqdm=True)
        with pytest.raises(ggbatch.GgbatchError, match="system applies only"):
            lm.generate_until([instance.Instance("generate_until", {}, ("Once", {"max_gen_toks": 2}), 0)],
                              disable_tqdm=True)
        chat = lm.apply_chat_template([{"role": "user", "content": "Once upon a time"}])
        assert "Be brief." in chat  # the chat template writes it
        [(logprob, _)] = lm.loglikelihood([instance.Instance("loglikelihood", {}, (chat, " there"), 0)],
                                          disable_tqdm=True)
        assert logprob < 0
    finally:
        lm.pool.close()


@pytest.mark.timeout(180)
@pytest.mark.model
def test_the_lm_eval_pool_warns_of_no_max_tokens_its_user_can_neither_see_nor_set(caplog):
    """lm-eval's requests bring their own max_gen_toks (and max_tokens in model_args is refused):
    a short model.n_ctx warned of the pool's default max_tokens (256) all the same. A Pool of
    ggbatch's own, whose calls use it, still warns."""
    pytest.importorskip("lm_eval")
    from conftest import STORIES, require
    from ggbatch.lm_eval import GgbatchLM

    model = str(require(STORIES, "stories260K"))
    with caplog.at_level("WARNING", logger="ggbatch"):
        lm = GgbatchLM(model=model, workers=1, threads=1, **{"model.n_ctx": 64})
        try:
            assert lm.max_length == 64  # started: planned and settled
        finally:
            lm.pool.close()
        assert not [r for r in caplog.records if "max_tokens" in r.getMessage()]
        with ggbatch.Pool(model=model, workers=1, threads=1, model__n_ctx=64):
            pass
    assert [r for r in caplog.records if r.getMessage().startswith("max_tokens: 256 is more than a sequence's")]


@pytest.mark.timeout(180)
@pytest.mark.model
def test_a_chat_template_that_does_not_parse_is_refused_at_once_named_as_model_args():
    """It was read with the model, in the pool's start thread: its error came at the first request,
    as 'ggbatch.Pool(): ...', which lm-eval's user never called. It needs no model: refused as the
    model is made, named as the model_args it came from."""
    pytest.importorskip("lm_eval.api.instance")
    from conftest import STORIES, require
    from ggbatch.lm_eval import GgbatchLM

    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.lm_eval model_args: prompt.chat_template: line 1"):
        GgbatchLM(model=str(require(STORIES, "stories260K")), workers=1, threads=1,
                  **{"prompt.chat_template": "{% for x in %}"})
