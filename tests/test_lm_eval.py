"""ggbatch as lm-eval's model (package/lm_eval.py, `ggbatch eval`): tasks defined over local files
(tests/data/lm_eval, never a download); log-likelihoods as llama-cpp-python computes lm-eval's own
requests one at a time; generate_until honours max_gen_toks and `until`."""

import os
import shutil
import subprocess

import pytest

import ggbatch
from helpers import ggbatch_command

pytestmark = [pytest.mark.timeout(300), pytest.mark.model, pytest.mark.slow]

TASKS = ["ggb_mc", "ggb_gen", "ggb_roll"]


@pytest.fixture(scope="module")
def lm(request):
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from conftest import STORIES, require
    from ggbatch.lm_eval import GgbatchLM

    model = GgbatchLM(model=str(require(STORIES, "stories260K")), workers=1, threads=1)
    yield model
    model.pool.close()


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    from conftest import ROOT

    for f in (ROOT / "tests" / "data" / "lm_eval").iterdir():
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)  # the task YAMLs name their data files relative to here
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return tmp_path


def test_simple_evaluate_matches_llama_cpp_python(lm, task_dir):
    import lm_eval
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    from test_loglik import TOLERANCE, reference

    out = lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=TaskManager(include_path=str(task_dir)))
    assert set(TASKS) <= set(out["results"])
    assert 0.0 <= out["results"]["ggb_mc"]["acc,none"] <= 1.0
    # The same requests, compared one by one with llama-cpp-python's own evaluation of lm-eval's
    # own tokenization (TemplateLM's, one text at a time; ggbatch's tokenizes each distinct text
    # once, in one pass).
    from lm_eval.api.model import TemplateLM

    pairs = [("Once upon a time there was a little", c) for c in (" girl", " dog ran", " big red tree")]
    pairs += [("", "Once upon a time"), ("Once upon a time there was a little ", "girl")]
    requests = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    got = lm.loglikelihood(requests)
    theirs = TemplateLM.loglikelihood(lm, requests)
    assert [g for _, g in got] == [g for _, g in theirs]
    assert all(abs(a - b) < TOLERANCE for (a, _), (b, _) in zip(got, theirs))
    encoded = [lm._encode_pair(c, x) if c else _empty_context_pair(lm, x) for c, x in pairs]
    want = reference(lm.pool._config.model, encoded)
    for (logprob, greedy), (token_logprobs, want_greedy) in zip(got, want):
        assert abs(logprob - sum(token_logprobs)) < TOLERANCE
        assert greedy == want_greedy


def _empty_context_pair(lm, continuation):
    """TemplateLM.loglikelihood's encoding of a request with an empty context."""
    tokens = lm.tok_encode(continuation, add_special_tokens=False)
    return ([lm.prefix_token_id], tokens) if lm.prefix_token_id != tokens[0] else (tokens[:1], tokens[1:])


def test_generate_until_honours_max_gen_toks_and_until(lm):
    from lm_eval.api.instance import Instance

    ctx = "Once upon a time there was a little girl"
    long, cut = lm.generate_until([Instance("generate_until", {}, (ctx, {"until": [], "max_gen_toks": 40}), 0),
                                   Instance("generate_until", {}, (ctx, {"until": ["."], "max_gen_toks": 40}), 1)])
    short = lm.generate_until([Instance("generate_until", {}, (ctx, {"until": [], "max_gen_toks": 3}), 0)])[0]
    assert len(lm.tok_encode(long, add_special_tokens=False)) > 10
    assert "." not in cut and long.startswith(cut + ".")
    assert len(lm.tok_encode(short, add_special_tokens=False)) <= 4


@pytest.mark.timeout(60)
def test_eval_without_lm_eval_says_how_to_install(tmp_path):
    hide = tmp_path / "sitecustomize.py"
    hide.write_text("import sys\nsys.modules['lm_eval'] = None\n")
    cmd = ggbatch_command("eval", "--model", "m.gguf", "--tasks", "x")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=50)
    assert done.returncode == 2, done.stderr
    assert "pip install 'ggbatch[eval]'" in done.stderr


@pytest.mark.timeout(240)
def test_eval_says_in_one_line_a_task_lm_eval_lacks_or_a_data_set_it_cannot_reach(tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from conftest import STORIES, require

    model = require(STORIES, "stories260K")
    # an empty Hugging Face cache, offline: hellaswag's data set (the docs' first example) is out of reach
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    for tasks, said in (("no_such_task", "ggbatch eval: lm-eval has no task named no_such_task (`lm-eval ls tasks`"),
                        ("hellaswg,arc_esy", "ggbatch eval: lm-eval has no task named hellaswg, arc_esy; did you mean "
                                             "hellaswag (for hellaswg), arc_easy (for arc_esy)? (`lm-eval ls tasks`"),
                        ("hellaswag", "ggbatch eval --tasks hellaswag: cannot load the task's data set: "
                                      "Couldn't reach 'Rowan/hellaswag' on the Hub (OfflineModeIsEnabled); "
                                      "HF_DATASETS_OFFLINE is set")):
        cmd = ggbatch_command("eval", "--model", model, "--tasks", tasks, "--limit", "2", "--model_args", "workers=1")
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=200)
        assert done.returncode == 2, done.stderr[-3000:]
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("ggbatch: error: " + said), last


BAD_TASK = """task: bad_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: bad.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{gold}}"
metric_list:
  - metric: acc
"""


def eval_local_task(tmp_path, name: str, task_yaml: str, data: dict[str, str]) -> subprocess.CompletedProcess:
    """`ggbatch eval` of one task of `task_yaml` in tmp_path/tasks, over the data files given, offline."""
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from conftest import STORIES, require

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "bad.yaml").write_text(task_yaml)
    for file, text in data.items():
        (tmp_path / file).write_text(text)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    cmd = ggbatch_command("eval", "--model", require(STORIES, "stories260K"), "--include_path", "tasks",
                          "--tasks", name, "--model_args", "workers=1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=200)


@pytest.mark.timeout(240)
def test_eval_says_in_one_line_a_data_file_the_datasets_library_cannot_read(tmp_path):
    """A .jsonl line that is not JSON ended in three tracebacks and status 1, the last saying only
    'An error occurred while generating the dataset'."""
    done = eval_local_task(tmp_path, "bad_mc", BAD_TASK, {
        "bad.jsonl": '{"context": "a", "choices": ["x", "y"], "gold": 0}\n{"context": broken\n'})
    assert done.returncode == 2, done.stderr[-3000:]
    # lm-eval's and the datasets library's tracebacks are gone, and so are the model's processes'
    # (still starting when the run ends, they printed their own, or the run waited on them for good)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("ggbatch: error: ")]
    assert len(said) == 1 and said[0].startswith("ggbatch: error: ggbatch eval --tasks bad_mc: cannot load the "
                                                 f"task's data set: {tmp_path / 'bad.jsonl'}: "), said
    assert "Trailing data at position" in said[0], said


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name, yaml_text, said", [
    ("bad_field", BAD_TASK.replace("bad_mc", "bad_field").replace("bad.jsonl", "good.jsonl")
     .replace("{{choices}}", "{{options}}"),
     "ggbatch eval --tasks bad_field: the task's templates name what its data does not hold: 'options' is undefined"),
    ("bad_yaml", "task: bad_yaml\ndataset_path: json\n  dataset_kwargs: [\n",
     "ggbatch eval: lm-eval has no task named bad_yaml: tasks/bad.yaml:3: not a task lm-eval can read (mapping "
     "values are not allowed here)"),
])
def test_eval_says_in_one_line_a_task_whose_yaml_or_templates_are_wrong(tmp_path, name, yaml_text, said):
    """A template naming a field the data lacks was lm-eval's 55-line traceback, exit 1; a task
    YAML that does not parse was 'lm-eval has no task named bad_yaml', with --include_path given."""
    done = eval_local_task(tmp_path, name, yaml_text,
                           {"good.jsonl": '{"context": "The cat", "choices": ["sat", "ran"], "gold": 0}\n'})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == f"ggbatch: error: {said}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("tasks, target, said", [
    ("bad_mc", "5", "the gold answer (doc_to_target) of its first document is choice 5, but doc_to_choice gives 2 "
     "choices (0 to 1)"),
    ("good_mc,bad_mc", "-3", "task bad_mc: the gold answer (doc_to_target) of its first document is choice -3, "
     "but doc_to_choice gives 2 choices (0 to 1)"),
])
def test_eval_says_in_one_line_a_gold_answer_out_of_its_choices(tmp_path, tasks, target, said):
    """A gold index past the choices (doc_to_target: 5 of ["a", "b"]) ended in an IndexError
    traceback, exit 1."""
    task = (BAD_TASK.replace("bad.jsonl", "good.jsonl").replace('"{{choices}}"', '["a", "b"]')
            .replace('"{{gold}}"', target))
    good = BAD_TASK.replace("bad_mc", "good_mc").replace("bad.jsonl", "good.jsonl")
    # beside another task, which is right: the line names the one that is wrong
    done = eval_local_task(tmp_path, tasks, task, {"tasks/good.yaml": good, "good.jsonl": (
        '{"context": "The cat", "choices": ["sat", "ran"], "gold": 0}\n')})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == f"ggbatch: error: ggbatch eval --tasks {tasks}: {said}"


def test_generate_until_returns_the_continuation_as_llama_cpp_python_makes_it(lm):
    import llama_cpp
    from lm_eval.api.instance import Instance

    ctx = "Once upon a time there was a little girl"
    got = lm.generate_until([Instance("generate_until", {}, (ctx, {"until": ["."], "max_gen_toks": 12}), 0)])[0]
    llm = llama_cpp.Llama(model_path=lm.pool._config.model, n_ctx=128, verbose=False)
    want = llm.create_completion(ctx, max_tokens=12, temperature=0.0, stop=["."])["choices"][0]["text"]
    assert got == want
    assert got.startswith(" ")  # the word's space, which a stripped answer loses


@pytest.mark.timeout(120)
def test_the_model_loads_while_lm_eval_builds_its_tasks(demo_model, tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from fake_engine import Fake
    from ggbatch.lm_eval import GgbatchLM

    gate = tmp_path / "gate"
    # The worker cannot be Ready while the gate is shut: a constructor that waited would hang here.
    lm = GgbatchLM(pretrained=demo_model, workers=1, engine_factory=Fake(build_gate=str(gate)),  # vLLM's key
                   device="cpu")
    assert not lm._starting.done()
    gate.touch()
    try:
        assert lm.tok_encode("Once upon a time")[0] == lm.prefix_token_id
        assert lm.max_length == 2048  # the demo model's training context
        assert lm.pool._config.n_gpu_layers == 0  # --device cpu: no layer on a GPU
    finally:
        lm.pool.close()
    for twice in ({}, {"model": demo_model, "pretrained": "other.gguf"}):
        with pytest.raises(ggbatch.GgbatchError, match="give the GGUF model once"):
            GgbatchLM(**twice)


def test_apply_chat_template_renders_the_models_template_for_lm_eval(demo_model, task_dir):
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from ggbatch.lm_eval import GgbatchLM

    lm = GgbatchLM(model=demo_model, workers=1, threads=1)  # the demo model's template is ChatML
    try:
        hi = [{"role": "user", "content": "Hi"}]
        assert lm.apply_chat_template(hi) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        # lm-eval's add_generation_prompt=False (a task's gen_prefix): the last message left open
        assert lm.apply_chat_template(hi, add_generation_prompt=False) == "<|im_start|>user\nHi"
        out = lm_eval.simple_evaluate(model=lm, tasks=["ggb_gen"], task_manager=TaskManager(include_path=str(task_dir)),
                                      num_fewshot=1, apply_chat_template=True, fewshot_as_multiturn=True,
                                      log_samples=True)
    finally:
        lm.pool.close()
    context = out["samples"]["ggb_gen"][0]["arguments"][0][0]
    assert context.startswith("<|im_start|>user\n") and context.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert context.count("<|im_start|>assistant\n") == 2  # the shot's answer, then the question's
    assert "exact_match,none" in out["results"]["ggb_gen"]


def test_a_template_that_writes_bos_gets_no_second_one(demo_model):
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from ggbatch.lm_eval import GgbatchLM

    lm = GgbatchLM(model=demo_model, workers=1, threads=1,
                   prompt__chat_template="{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    try:
        text = lm.apply_chat_template([{"role": "user", "content": "Once upon a time"}])
        assert text == "<s>Once upon a time"
        tokens = lm.tok_encode(text)
        assert tokens == lm.tok_encode("Once upon a time") and tokens.count(lm.prefix_token_id) == 1
        assert lm.tokenizer_name == f"ggbatch:{demo_model.rsplit('/', 1)[-1]}:{lm.pool.prompt_fingerprint}"
    finally:
        lm.pool.close()


def test_generation_kwargs_become_ggbatch_settings_and_unknown_ones_are_said(caplog):
    from ggbatch.runner.tools.lm_eval_requests import generation_of

    sampled = generation_of({"until": "\n\n", "max_gen_toks": 7, "do_sample": True, "temperature": 0.7,
                             "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                             "presence_penalty": 0.5, "frequency_penalty": -0.25})
    assert sampled.stop == ("\n\n",) and sampled.max_tokens == 7
    s = sampled.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty) == (0.7, 0.9, 20, 0.05, 1.1)
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, -0.25)
    greedy = generation_of({"until": ["."], "do_sample": False, "temperature": 0.7, "top_p": 0.9})
    assert greedy.sampling.temperature == 0.0 and greedy.sampling.top_p == 1.0
    with caplog.at_level("WARNING", logger="ggbatch"):
        generation_of({"num_beams": 4})
        generation_of({"num_beams": 4})
    assert [r.getMessage() for r in caplog.records].count(
        "ggbatch.lm_eval: generation_kwargs ['num_beams'] have no ggbatch setting and are not used") == 1


def test_each_call_shows_its_requests_answered(lm, capsys):
    from lm_eval.api.instance import Instance

    ctx = "Once upon a time there was a little"
    lm.loglikelihood([Instance("loglikelihood", {}, (ctx, c), i) for i, c in enumerate((" girl", " dog", " cat"))])
    lm.loglikelihood([Instance("loglikelihood", {}, (ctx, " girl"), 0)], disable_tqdm=True)
    err = capsys.readouterr().err.replace("\r", "\n")
    bars = [line for line in err.splitlines() if "ggbatch loglikelihood" in line]
    # the three requests of one context; the second call shows none
    assert bars and "100%" in bars[-1] and "3/3" in bars[-1]


def test_lm_evals_device_says_where_the_layers_go_unless_the_settings_do():
    from ggbatch.runner.tools.lm_eval_requests import device_settings

    assert device_settings("cpu", {}) == {"model__n_gpu_layers": 0}
    for gpu in ("cuda", "cuda:1", "mps"):
        assert device_settings(gpu, {"workers": 2}) == {"model__n_gpu_layers": "all"}
    assert device_settings(None, {}) == device_settings("tpu", {}) == {}
    for own in ({"model.n_gpu_layers": "all"}, {"model__n_gpu_layers": 4}, {"devices": "0"}):
        assert device_settings("cpu", own) == {}
