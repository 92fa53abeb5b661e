"""ggbatch as lm-eval's model at the edge of the model's context (package/lm_eval.py,
workers/engine/loglik.py, `ggbatch eval`): rolling windows of max_length + 1 tokens feed
max_length and fit; a request longer than the window is cut as lm-eval's Hugging Face and vLLM
models cut it; what still cannot be answered ends the run in one line naming the request; the
command's --model_args, --device and max_length checks. Real lm-eval over tasks written here, real
llama.cpp on ../shared's TinyStories-656K (512-token context) and stories260K (2048)."""

import json
import logging
import subprocess
from array import array

import numpy as np
import pytest

import ggbatch
from conftest import GSM8K, MODELS, STORIES, require
from helpers import ggbatch_command
from test_loglik_rows import VOCAB, log_softmax, score

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: "
                              "pip install 'ggbatch[eval]'")

from lm_eval.api.instance import Instance  # noqa: E402

from ggbatch.lm_eval import GgbatchLM  # noqa: E402
from ggbatch.runner.tools.lm_eval_requests import (  # noqa: E402
    generation_of,
    generation_window,
    request_seeds,
    scored_window,
)
from ggbatch.workers.engine import loglik  # noqa: E402
from ggbatch.workers.protocol import Question  # noqa: E402

TINY = MODELS / "TinyStories-656K-Q8_0.gguf"  # trained for 512 tokens: its vocabulary has no digits' neighbours
STORY = "Once upon a time there was a little girl named Lily. She liked to play with her dog in the big park. "
TOLERANCE = 0.01  # nats, the bar against llama-cpp-python's own


def long_text(n_questions: int = 60) -> str:
    """GSM8K's questions run together: about 8,300 stories260K tokens for 60."""
    with open(require(GSM8K, "GSM8K questions")) as f:
        return " ".join(json.loads(line)["question"] for line in list(f)[:n_questions])


def fed_reference(model: str, pairs: list[tuple[list[int], list[int]]], n_ctx: int) -> list[float]:
    """Each (context, continuation)'s log-likelihood as lm-eval's Hugging Face model computes it:
    llama-cpp-python fed (context + continuation)[:-1] alone, the continuation's rows read."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, verbose=False)
    out = []
    try:
        for context, cont in pairs:
            llm.reset()
            llm.eval((context + cont)[:-1])
            rows = np.array(llm.scores[len(context) - 1:len(context) + len(cont) - 1], dtype=np.float64)
            top = rows.max(axis=1)
            log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
            out.append(float((rows[np.arange(len(cont)), cont] - log_z).sum()))
    finally:
        llm.close()
    return out


def request(kind: str, args: tuple, task: str = "t", doc: int = 0) -> Instance:
    return Instance(kind, {}, args, doc, metadata=(task, doc, 1))


# -- without a model ----------------------------------------------------------------------------


def test_a_scored_question_fits_when_its_fed_tokens_do():
    """lm-eval's rolling window of max_length + 1 tokens feeds max_length: it fits a context of
    max_length tokens per sequence; one more token does not."""
    fits = Question("q", array("i", [1] * 5), 0, continuations=(array("i", [2] * 4),))
    assert loglik.problem(fits, 8) is None
    longer = Question("q", array("i", [1] * 6), 0, continuations=(array("i", [2] * 4),))
    assert "10 tokens, 9 of them fed to the model, context per sequence is 8" in loglik.problem(longer, 8)


def test_a_one_token_context_feeds_its_one_token_continuation():
    """A prompt of one token is what batch-invariant mode takes for a decode step: the carrier of
    a one-token context keeps its continuation's token, and still reads the context's row only."""
    q = Question("q", array("i", [1]), 0, continuations=(array("i", [4]), array("i", [5])))
    rows = np.random.default_rng(4).normal(size=(2, VOCAB)).astype(np.float32)
    seqs, answer = score(q, rows)
    assert [list(s.prompt) for s in seqs] == [[1, 4]]
    assert loglik.logit_range(seqs[0], 0, 2) == (0, 1)
    assert [s.logprob for s in answer.scored] == pytest.approx([log_softmax(rows[0])[4], log_softmax(rows[0])[5]])


def test_requests_are_cut_from_the_left_as_lm_evals_hugging_face_model_cuts_them():
    ctx, cont = list(range(10)), [20, 21, 22]
    assert scored_window(ctx, cont, 8, "r") == ([4, 5, 6, 7, 8, 9], cont)  # 9 tokens, 8 fed
    assert scored_window(ctx, cont, 20, "r") == (ctx, cont)
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.lm_eval: task 't' doc 3: its continuation has 3 "):
        scored_window(ctx, cont, 2, "task 't' doc 3")
    toks = array("i", range(100))
    assert generation_window(toks, 20, 64) == (toks[56:], 20)  # the last max_length - max_gen_toks
    assert generation_window(toks[:30], 20, 64) == (toks[:30], 20)
    assert generation_window(toks, 64, 64) == (toks[37:], 1)  # no room: as lm-eval's maybe_truncate


def test_gen_kwargs_that_are_not_numbers_are_refused_in_one_line_naming_them():
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.lm_eval: task 'x' doc 2: generation_kwargs "
                       r"max_gen_toks must be a whole number, 0 or more, got 'abc'$"):
        generation_of({"max_gen_toks": "abc"}, "task 'x' doc 2")
    with pytest.raises(ggbatch.GgbatchError, match="temperature must be a number, got 'hot'"):
        generation_of({"do_sample": True, "temperature": "hot"})
    assert generation_of({"max_gen_toks": "12"}).max_tokens == 12


def test_a_requests_seed_is_its_own_whatever_else_the_call_holds():
    a, b, c = [(("t", 0, 0), args) for args in (("Once", {"until": []}), ("Upon", {"until": []}),
                                                ("Once", {"until": ["."]}))]
    alone, mixed = request_seeds(0, [a]), request_seeds(0, [b, c, a])
    assert alone[0] == mixed[2] and len(set(mixed)) == 3
    repeats = request_seeds(0, [a, a, a])  # lm-eval's `repeats`: copies of one instance, each its own sample
    assert repeats[0] == alone[0] and len(set(repeats)) == 3
    assert request_seeds(7, [a]) != alone  # the settings' sampling.seed
    # another task's, or another document's, request with the same prompt is no repeat: each keeps
    # the sample it has alone (under --samples, --limit or another mix of tasks)
    assert request_seeds(0, [(("u", 0, 0), a[1]), a]) == [alone[0], alone[0]]
    assert request_seeds(0, [a, (("t", 2, 0), a[1])]) == [alone[0], alone[0]]
    assert request_seeds(0, [(None, a[1])] * 2)[0] == alone[0]  # no identity (Python's own requests)


def test_max_length_beyond_the_models_context_is_refused_at_construction():
    tiny = str(require(TINY, "TinyStories-656K"))
    # refused before any worker starts: one line naming max_length and the model's context
    with pytest.raises(ggbatch.GgbatchError, match=r"max_length=1024 is more than the model's context, 512 tokens"):
        GgbatchLM(model=tiny, max_length=1024)
    with pytest.raises(ggbatch.GgbatchError, match=r"max_length must be a whole number of tokens, got 'abc'"):
        GgbatchLM(model=tiny, max_length="abc")
    with pytest.raises(ggbatch.GgbatchError, match=r"max_length=300 is more than model.n_ctx=256"):
        GgbatchLM(model=tiny, max_length=300, model__n_ctx=256)
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.lm_eval model_args: unknown key 'wokers'"):
        GgbatchLM(model=tiny, wokers=2)


@pytest.mark.parametrize("setting, said", [
    ({"max_lenght": 64}, r"unknown key 'max_lenght' \(did you mean 'max_length'\?\); the keys: .*"
                         r"max_length, .*pretrained, .*sampling.seed"),
    ({"n_gpu_layers": 1}, r"unknown key 'n_gpu_layers' \(did you mean 'model.n_gpu_layers'\?\)"),
    ({"temperature": 1}, r"temperature is not used: .* do_sample, temperature"),
    ({"max_tokens": 2}, r"max_tokens is not used: lm-eval's requests decide it, through a task's generation_kwargs "
                        r"max_gen_toks \(--gen_kwargs max_gen_toks=N\)$"),
    ({"sampling__temperature": 1.5}, r"sampling__temperature is not used: .* do_sample, temperature"),
    ({"sampling": {"seed": 3, "top_k": 2}}, r"sampling is not used: .*only sampling.seed is a model_args setting$"),
    ({"stop": "a"}, r"stop is not used: .* until"),
    ({"output": "o.jsonl"}, r"output is not used: lm-eval's tasks give the questions and it writes the results"),
])
def test_model_args_that_lm_evals_requests_decide_or_lm_eval_names_are_said_so(setting, said):
    """Settings lm-eval's requests decide (the generation: each request's gen_kwargs) would do
    nothing: refused in one line saying what does it; a typo of one of lm-eval's own names
    (max_length) is told that name. Before any process starts."""
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.lm_eval model_args: " + said):
        GgbatchLM(model=str(require(TINY, "TinyStories-656K")), **setting)
    GgbatchLM(model=str(require(TINY, "TinyStories-656K")), sampling={"seed": 3}, max_length=64).pool.close()


@pytest.mark.timeout(120)
@pytest.mark.model
def test_batch_size_and_device_in_model_args_beside_lm_evals_own_are_taken():
    """lm-eval passes its --batch_size, --max_batch_size and --device beside model_args, whether
    given or not: the same key in model_args was lm-eval's TypeError traceback."""
    lm = GgbatchLM.create_from_arg_string(f"model={require(TINY, 'TinyStories-656K')},batch_size=4,device=cpu",
                                          {"batch_size": 1, "max_batch_size": None, "device": "cuda"})
    try:
        assert lm.max_length == 512  # its pool started: the model's context read
    finally:
        lm.pool.close()


# -- on real models -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_lm():
    model = GgbatchLM(model=str(require(TINY, "TinyStories-656K")), workers=1, threads=1)
    yield model
    model.pool.close()


@pytest.fixture(scope="module")
def stories_lm():
    model = GgbatchLM(model=str(require(STORIES, "stories260K")), workers=1, threads=1)
    yield model
    model.pool.close()


@pytest.mark.timeout(300)
@pytest.mark.model
@pytest.mark.slow
def test_texts_longer_than_the_context_score_as_llama_cpp_python_feeds_lm_evals_windows(tiny_lm):
    """The model was trained for 512 tokens: max_length is 512, each rolling window holds 513
    tokens and feeds 512; a loglikelihood request longer than that keeps its last 513."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    assert tiny_lm.max_length == 512
    text = STORY * 70
    tokens = tiny_lm.tok_encode(text, add_special_tokens=False)
    assert len(tokens) > 2 * 512
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
        token_list=tokens, prefix_token=tiny_lm.prefix_token_id, max_seq_len=512, context_len=1)]
    assert max(len(c) + len(x) for c, x in windows) == 513
    got = tiny_lm.loglikelihood_rolling([request("loglikelihood_rolling", (text,))])
    model = str(TINY)
    assert got[0] == pytest.approx(sum(fed_reference(model, windows, 512)), abs=TOLERANCE)

    context, cont = tiny_lm._encode_pair(text, " and they were happy")
    cut = ((context + cont)[-513:][:-len(cont)], cont)
    (logprob, _), = tiny_lm.loglikelihood([request("loglikelihood", (text, " and they were happy"))])
    assert logprob == pytest.approx(fed_reference(model, [cut], 512)[0], abs=TOLERANCE)


@pytest.mark.timeout(300)
@pytest.mark.model
@pytest.mark.slow
def test_a_request_that_cannot_be_scored_ends_the_run_naming_it(tiny_lm):
    with pytest.raises(ggbatch.GgbatchError, match=r"^ggbatch.lm_eval: task 'mc' doc 7: its continuation has \d+ "
                       r"tokens, more than max_length=512"):
        tiny_lm.loglikelihood([request("loglikelihood", ("Once", " " + STORY * 60), "mc", 7)])


@pytest.mark.timeout(300)
@pytest.mark.model
@pytest.mark.slow
def test_a_text_the_vocabulary_cannot_take_ends_the_run_naming_its_request(tiny_lm):
    """TinyStories' vocabulary has no '(' and no byte fallback: the error named `ggbatch.Pool()`,
    which an lm-eval user never made, and no task or document."""
    said = "the model's tokenizer cannot take its text: the model's vocabulary has no token for U+0028 ("
    calls = [(tiny_lm.loglikelihood, [request("loglikelihood", ("Once", " upon"), "mc", 0),
                                      request("loglikelihood", ("Once (upon", " a time"), "mc", 4)], "mc", 4),
             (tiny_lm.loglikelihood, [request("loglikelihood", ("", " (upon"), "bare", 2)], "bare", 2),
             (tiny_lm.loglikelihood_rolling, [request("loglikelihood_rolling", ("Once (upon",), "roll", 1)],
              "roll", 1),
             (tiny_lm.generate_until, [request("generate_until", ("Once", {"until": []}), "gen", 0),
                                       request("generate_until", ("Once (", {"until": []}), "gen", 3)], "gen", 3)]
    for call, requests, task, doc in calls:
        with pytest.raises(ggbatch.GgbatchError) as err:
            call(requests)
        assert str(err.value).startswith(f"ggbatch.lm_eval: task '{task}' doc {doc}: {said}"), str(err.value)


@pytest.mark.timeout(300)
@pytest.mark.model
@pytest.mark.slow
def test_a_perplexity_task_and_a_long_context_run_in_lm_eval_on_a_2048_token_model(stories_lm, tmp_path,
                                                                                   monkeypatch):
    """stories260K was trained for 2048 tokens: lm-eval's windows of 2049 tokens fit, and a
    context longer than the window is answered from its last tokens (never a silent '')."""
    from lm_eval.tasks import TaskManager

    text = long_text()
    assert len(stories_lm.tok_encode(text)) > 3 * 2048
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": text, "target": "x"}) + "\n")
    common = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: long.jsonl\ntest_split: test\n"
    (tmp_path / "roll.yaml").write_text(f"task: lim_roll\n{common}output_type: loglikelihood_rolling\n"
                                        "doc_to_text: ''\ndoc_to_target: '{{text}}'\n"
                                        "metric_list:\n  - metric: word_perplexity\n")
    (tmp_path / "gen.yaml").write_text(f"task: lim_gen\n{common}output_type: generate_until\n"
                                       "doc_to_text: '{{text}}'\ndoc_to_target: '{{target}}'\n"
                                       "generation_kwargs:\n  until: []\n  max_gen_toks: 12\n"
                                       "metric_list:\n  - metric: exact_match\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = lm_eval.simple_evaluate(model=stories_lm, tasks=["lim_roll", "lim_gen"], log_samples=True,
                                  task_manager=TaskManager(include_path=str(tmp_path)))
    assert out["results"]["lim_roll"]["word_perplexity,none"] > 1.0
    assert out["samples"]["lim_gen"][0]["resps"][0][0].strip()


@pytest.mark.timeout(300)
@pytest.mark.model
@pytest.mark.slow
def test_a_context_near_the_window_keeps_room_for_max_gen_toks(stories_lm):
    """A context of 2029 to 2048 tokens keeps its last 2048 - 20: the answer has its 20 tokens,
    as lm-eval's Hugging Face model gives them. max_gen_toks 0 is the empty answer."""
    words = long_text().split()
    low, high = 1, len(words)  # the most words whose text stays within 2047 tokens
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if len(stories_lm.tok_encode(" ".join(words[:mid]))) <= 2047 else (low, mid - 1)
    context = " ".join(words[:low])
    assert 2029 <= len(stories_lm.tok_encode(context)) <= 2047
    got, none = stories_lm.generate_until([request("generate_until", (context, {"until": [], "max_gen_toks": 20})),
                                           request("generate_until", (context, {"until": [], "max_gen_toks": 0}))])
    assert len(stories_lm.tok_encode(got, add_special_tokens=False)) >= 18, got
    assert none == ""


@pytest.mark.timeout(300)
@pytest.mark.model
def test_a_max_gen_toks_of_max_length_or_more_is_said_with_the_room_its_answer_gets(tiny_lm, caplog):
    """lm-eval's maybe_truncate rule (the context's last max_length - 1 tokens, the room left to
    generate) said as that rule: not as max_length - max_gen_toks, which is below 0 here."""
    with caplog.at_level(logging.WARNING, logger="ggbatch"):
        tiny_lm.generate_until([request("generate_until", (STORY * 30, {"until": [], "max_gen_toks": 600}))])
    said = [r.getMessage() for r in caplog.records if "generate_until requests" in r.getMessage()]
    assert said == ["ggbatch.lm_eval: 1 of 1 generate_until requests ask for max_gen_toks of max_length (512) or more: "
                    "each keeps at most its context's last 511 tokens and generates in the room left, as few as 1 "
                    "token (lm-eval's maybe_truncate rule)"]


# -- ggbatch eval --------------------------------------------------------------------------------


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    import shutil

    from conftest import ROOT

    for f in (ROOT / "tests" / "data" / "lm_eval").iterdir():
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return tmp_path


@pytest.mark.timeout(200)
@pytest.mark.model
@pytest.mark.slow
def test_eval_takes_json_model_args_and_keeps_the_model_off_the_gpu_without_device(task_dir):
    stories = str(require(STORIES, "stories260K"))
    cmd = ggbatch_command("eval", "--model", stories, "--model_args", '{"workers": 1, "threads": 1}',
                          "--include_path", task_dir, "--tasks", "ggb_mc", "--limit", "2", "--output_path", "out")
    done = subprocess.run(cmd, cwd=task_dir, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "n_gpu_layers all" not in done.stderr  # lm-eval's default device, cuda:0, is not asked for
    results = json.loads(next((task_dir / "out").rglob("results_*.json")).read_text())
    assert results["config"]["model_args"] == {"model": stories, "workers": 1, "threads": 1}
    assert results["config"]["device"] == "cpu"


@pytest.mark.timeout(120)
@pytest.mark.model
def test_eval_refuses_a_second_model_in_model_args(task_dir):
    stories = str(require(STORIES, "stories260K"))
    for given in ("model=other.gguf,workers=1", '{"pretrained": "other.gguf"}'):
        cmd = ggbatch_command("eval", "--model", stories, "--model_args", given, "--include_path", task_dir,
                              "--tasks", "ggb_mc")
        done = subprocess.run(cmd, cwd=task_dir, capture_output=True, text=True, timeout=100)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1].startswith("ggbatch: error: ggbatch eval: give the GGUF model "
                                                               "once"), done.stderr[-2000:]


@pytest.mark.timeout(120)
@pytest.mark.model
def test_eval_refuses_an_output_path_lm_eval_could_not_write_before_it_evaluates(task_dir):
    # lm-eval writes its results after the whole evaluation and, where it cannot, warns and exits 0
    stories = str(require(STORIES, "stories260K"))
    (task_dir / "a_file").write_text("x")
    for output in ("a_file/out", "a_file/deeper/results.json"):
        cmd = ggbatch_command("eval", "--model", stories, "--include_path", str(task_dir), "--tasks", "ggb_mc",
                              "--output_path", output)
        done = subprocess.run(cmd, cwd=task_dir, capture_output=True, text=True, timeout=100)
        assert done.returncode == 2, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ggbatch: error: {output}: the folder of lm-eval's results (--output_path), ") \
            and f"{task_dir / 'a_file'} is a file, not a folder" in last, done.stderr[-2000:]
        assert "Building contexts" not in done.stderr  # refused before lm-eval's work
