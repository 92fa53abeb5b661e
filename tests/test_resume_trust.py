"""Resumed and streamed runs answer as one uninterrupted run does: an answer taken from the
journal is written as its line asks (issue 29, item 7), and a streamed file's later, longer
questions are answered, not refused for a context sized on its first window (item 20). Real
processes, the real tiny model."""

from __future__ import annotations

import json
import logging
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from conftest import gsm8k_records
from fake_engine import Fake
from ggbatch import build_config
from ggbatch.runner.errors import ModelError
from ggbatch.runner.job import STREAMED, run_job
from ggbatch.runner.plan import layout as layouts
from ggbatch.runner.plan.growth import ContextGrowth, PlanInputs
from ggbatch.runner.plan.layout import PromptFacts
from ggbatch.runner.plan.memory import ModelDims
from ggbatch.runner.plan.nodes import Node, NodePlan
from ggbatch.workers.protocol import GenerationParams, Question
from helpers import ggbatch as cli
from helpers import question_records
from helpers import write_jsonl as write_lines

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture
def said(caplog):
    """The ggbatch log as a test reads it (a CLI run in this process may have stopped its
    records from reaching the root logger)."""
    logger = logging.getLogger("ggbatch")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="ggbatch"):
            yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def ggbatch(*args):
    return cli("run", *args, timeout=150)


def batch_requests(n: int) -> list[dict]:
    """n OpenAI Batch lines on GSM8K-like questions, /v1/chat/completions and /v1/completions in turn."""
    lines = []
    for i, rec in enumerate(question_records(n)):
        text = rec["question"][:160]
        if i % 2:
            lines.append({"custom_id": f"c{i}", "method": "POST", "url": COMPLETIONS,
                          "body": {"model": "gpt-3.5-turbo-instruct", "prompt": text, "max_tokens": 12}})
        else:
            lines.append({"custom_id": f"m{i}", "method": "POST", "url": CHAT,
                          "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}],
                                   "max_tokens": 12}})
    return lines


def checked_bodies(path: Path, requests: list[dict]) -> list[dict]:
    """The output's lines, each body read with the openai package's type for its line's url."""
    out = [json.loads(line) for line in path.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == [r["custom_id"] for r in requests]
    for o, r in zip(out, requests):
        assert o["error"] is None, o
        body = o["response"]["body"]
        if r["url"] == COMPLETIONS:
            assert Completion.model_validate(body).object == "text_completion", o
        else:
            assert ChatCompletion.model_validate(body).object == "chat.completion", o
    return out


def without_times(lines: list[dict]) -> list[dict]:
    """The lines less what says when each answer was made (ids derive from it, and created)."""
    for line in lines:
        line.pop("id")
        line["response"].pop("request_id")
        line["response"]["body"].pop("id")
        line["response"]["body"].pop("created")
    return lines


@pytest.mark.timeout(240)
@pytest.mark.model
@pytest.mark.slow
def test_a_resumed_openai_batch_writes_each_journaled_answer_as_its_line_asks(tmp_path, demo_model):
    requests = batch_requests(16)
    whole, out = tmp_path / "whole.jsonl", tmp_path / "out.jsonl"
    questions = tmp_path / "batch.jsonl"
    write_lines(questions, requests)
    args = ("--model", demo_model, "--input", questions, "--max-tokens", 12)
    assert (r := ggbatch(*args, "--output", whole)).returncode == 0, r.stderr
    expected = without_times(checked_bodies(whole, requests))

    write_lines(questions, requests[:7])  # a first run over the start of the file ...
    assert (r := ggbatch(*args, "--output", out)).returncode == 0, r.stderr
    write_lines(questions, requests)  # ... then the whole file: 7 answers come from the journal
    report = tmp_path / "report.json"
    assert (r := ggbatch(*args, "--output", out, "--report", report)).returncode == 0, r.stderr
    assert json.loads(report.read_text())["questions"]["from_journal"] == 7
    resumed = out.read_bytes()
    assert without_times(checked_bodies(out, requests)) == expected

    # A rerun takes every answer from the journal and writes the same file, ids included.
    assert (r := ggbatch(*args, "--output", out)).returncode == 0, r.stderr
    assert out.read_bytes() == resumed


# -- item 20: a streamed file's context grows with its windows ----------------------------------


def plain_plan(available: int, longest: int = 40):
    """A one-worker plan of 4 slots settled on a first window whose longest prompt is `longest`
    tokens, for a small model whose KV cell costs 64 KiB (32 layers × 8 heads × 64 × K and V × 2
    bytes), so that memory binds early."""
    # flash attention on: the plan's compute stays the same at every context (without it a prompt
    # step's attention scores grow with the context too), so the KV cells alone bind
    started = replace(layouts.start([0], workers=1, threads=1, slots=4, repack=False, n_records=STREAMED,
                                    flags=frozenset()), flash_attn=True)
    dims = ModelDims(file_bytes=1 << 20, n_layer=32, n_embd=64, n_head=8, n_head_kv=8, head_dim=64, n_vocab=512)
    facts = PromptFacts(STREAMED, longest, 0, 2048, dims)
    lay, memory = layouts.settle(started, facts, slots=4, max_tokens=16, available=available, cores=[0])
    plan = NodePlan.of([Node(None, "", (0,))], [started])
    inputs = PlanInputs(plan, (facts,), (available,), 4, None, None, False)
    return ContextGrowth(inputs, replace(plan, layouts=(lay,)), [memory], "m.gguf", array("i"),
                         GenerationParams(max_tokens=16))


def question(n_tokens: int, max_tokens=None) -> Question:
    return Question(f"q{n_tokens}", array("i", [1] * n_tokens), 0,
                    GenerationParams(max_tokens=max_tokens) if max_tokens else None)


def test_a_window_of_longer_prompts_grows_the_context_to_what_they_need():
    growth = plain_plan(available=8 << 30)
    assert growth.n_ctx_seq == 40 + 16 + 1
    assert growth.engines_for([question(30), question(40)]) is None  # they fit: nothing restarts
    engines = growth.engines_for([question(300), question(100, max_tokens=400)])
    assert engines is not None and {e.n_ctx_seq for e in engines.values()} == {501} == {growth.n_ctx_seq}
    assert growth.engines_for([question(3000)]) is not None and growth.n_ctx_seq == 2048  # the model's own
    assert growth.engines_for([question(3000)]) is None


def test_the_context_grows_only_as_far_as_the_memory_plan_holds(said):
    # 90 MiB leaves room for a few hundred KV cells at 64 KiB: 4 slots of 57 fit, one sequence of 1517 does not.
    growth = plain_plan(available=90 << 20)
    assert growth.engines_for([question(1500)]) is not None
    assert 57 < growth.n_ctx_seq < 1517 and growth.memory[0].fits
    assert growth.plan.layouts[0].slots < 4  # fewer slots first, as the first plan would shrink
    assert "a question needs a context of 1517 tokens per sequence, the memory plan holds" in said.text


def test_a_context_the_job_sets_never_grows():
    growth = plain_plan(available=8 << 30)
    growth = ContextGrowth(replace(growth.inputs, n_ctx=57), growth.plan, growth.memory, "m.gguf", array("i"),
                           growth.generation)
    assert growth.engines_for([question(300)]) is None


def test_a_context_grown_past_the_cpu_bound_keeps_the_flash_attention_its_first_window_decided():
    """Auto is off on a CPU up to 4,096 tokens a sequence: a streamed file whose context grew past
    it ran the rest of its questions with flash attention on, and reported it on for them all."""
    started = layouts.start([0], workers=1, threads=1, slots=4, repack=False, n_records=STREAMED,
                            flags=frozenset())  # flash_attn: auto
    dims = ModelDims(file_bytes=1 << 20, n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_vocab=512)
    facts = PromptFacts(STREAMED, 40, 0, 16384, dims)
    lay, memory = layouts.settle(started, facts, slots=4, max_tokens=16, available=8 << 30, cores=[0])
    plan = NodePlan.of([Node(None, "", (0,))], [started])
    growth = ContextGrowth(PlanInputs(plan, (facts,), (8 << 30,), 4, None, None, False), replace(plan, layouts=(lay,)),
                           [memory], "m.gguf", array("i"), GenerationParams(max_tokens=16))
    engines = growth.engines_for([question(6000)])
    assert engines is not None and growth.n_ctx_seq == 6017
    assert lay.flash_attn is False and growth.plan.layouts[0].flash_attn is False
    assert {e.flash_attn for e in engines.values()} == {False}


def short_then_long(path: Path, n_short: int, n_long: int) -> None:
    """Short questions, then long ones: three GSM8K questions in one, about 1.7 characters a token
    in stories260K's vocabulary of 512, where the context's guess from the file's bytes counts 3."""
    gsm = [r["question"] for r in gsm8k_records(3 * n_long)]
    lines = [{"questionID": f"s{i}", "question": f"What is {i} plus {i % 7}?"} for i in range(n_short)]
    lines += [{"questionID": f"l{i}", "question": " ".join(gsm[3 * i:3 * i + 3])} for i in range(n_long)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def stories_job(tmp_path: Path, stories: str, questions: Path, out: Path):
    return build_config([("t", {"model": stories, "input": str(questions), "output": str(out), "workers": 1,
                                "slots": 4, "max_tokens": 6})])


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_streamed_files_later_longer_questions_are_answered_as_in_one_window(tmp_path, stories):
    questions = tmp_path / "q.jsonl"
    short_then_long(questions, 10, 6)
    one, streamed = tmp_path / "one.json", tmp_path / "streamed.json"
    whole = run_job(stories_job(tmp_path, stories, questions, one), progress="log")
    rows = json.loads(one.read_text())
    assert all(r["answer"] is not None for r in rows), [r["error"] for r in rows if r["error"]][:2]

    report = run_job(stories_job(tmp_path, stories, questions, streamed), progress="log", window=4)
    assert streamed.read_bytes() == one.read_bytes()
    context = whole.as_json()["layout"]["n_ctx_per_sequence"]
    assert report.as_json()["layout"]["n_ctx_per_sequence"] == context

    # Resumed with every question of the first window journaled: the context is sized on no
    # prompt at all, and grows with the windows that hold questions still to answer.
    resumed = tmp_path / "resumed.json"
    short_then_long(questions, 10, 0)
    run_job(stories_job(tmp_path, stories, questions, resumed), progress="log", window=4)
    short_then_long(questions, 10, 6)
    run_job(stories_job(tmp_path, stories, questions, resumed), progress="log", window=4)
    assert resumed.read_bytes() == one.read_bytes()


@pytest.mark.model
@pytest.mark.timeout(180)
def test_workers_busy_with_a_window_build_a_larger_context_in_place_and_lose_nothing(tmp_path, stories, said):
    # Two workers of the fake engine (which refuses a prompt its context cannot hold, as the real
    # one does), windows of 20, prompts longer window after window: the context grows several
    # times while questions are in flight. The growth steps follow stories260K's vocabulary and
    # trained context: the demo model's chat template and larger context take them in one.
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"questionID": f"q{i}", "question": " ".join(["seven"] * (1 + i // 4))})
                                 + "\n" for i in range(200)))
    one, streamed = tmp_path / "one.json", tmp_path / "streamed.json"
    def config(out):
        return build_config([("t", {"model": stories, "input": str(questions), "output": str(out),
                                    "workers": 2, "slots": 4, "max_tokens": 4})])
    run_job(config(one), engine_factory=Fake(context=True), progress="log")
    report = run_job(config(streamed), engine_factory=Fake(context=True, slow=0.002), progress="log", window=20)
    assert all(r["answer"] is not None for r in json.loads(streamed.read_text()))
    assert streamed.read_bytes() == one.read_bytes()
    assert said.text.count("tokens of context per sequence (a later window of the file") >= 3
    workers = report.as_json()["workers"].values()
    assert [w["restarts"] for w in workers] == [0, 0]  # a larger context is no crash
    assert all(w["contexts"] >= 2 for w in workers), workers  # built again, in the same process


@pytest.mark.timeout(300)
def test_a_fresh_run_refused_before_it_begins_leaves_the_earlier_journal_whole(tmp_path, demo_model):
    """--fresh throws the earlier answers away only once the new run begins: one refused for
    its template (exit 2, nothing answered) leaves them to the next run, which resumes."""
    questions, out = tmp_path / "q.jsonl", tmp_path / "a.jsonl"
    write_lines(questions, [{"questionID": f"q{i}", "question": f"Question {i}?"} for i in range(3)])
    args = ("--model", demo_model, "--input", questions, "--output", out, "--max-tokens", 4)
    assert (r := ggbatch(*args)).returncode == 0, r.stderr
    journal = Path(f"{out}.journal.jsonl")
    earlier = journal.read_bytes()
    r = ggbatch(*args, "--fresh", "--template", "{{ questoin }}")
    assert r.returncode == 2 and "no field 'questoin'" in r.stderr, r.stderr
    assert journal.read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.jsonl.journal.jsonl", "q.jsonl"]
    r = ggbatch(*args)
    assert r.returncode == 0 and "resuming: 3 answers" in r.stderr, r.stderr
    assert (r := ggbatch(*args, "--fresh")).returncode == 0, r.stderr
    assert "resuming" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.jsonl.journal.jsonl", "q.jsonl"]


@pytest.mark.timeout(300)
def test_a_run_no_worker_can_start_leaves_the_answers_file_and_the_journal_as_they_were(tmp_path, demo_model):
    """A model error (exit 2: no worker can make its context) writes no answers file, and a fresh
    run's journal never takes the earlier one's place: the complete answers of the run before are
    all still there, in the file and for a rerun."""
    questions, out = tmp_path / "q.jsonl", tmp_path / "a.jsonl"
    write_lines(questions, [{"questionID": f"q{i}", "question": f"Question {i}?"} for i in range(3)])
    config = build_config([("t", {"model": demo_model, "input": str(questions), "output": str(out),
                                  "workers": 1})])
    run_job(config, engine_factory=Fake(), progress="off")
    journal = Path(f"{out}.journal.jsonl")
    answers, earlier = out.read_bytes(), journal.read_bytes()
    with pytest.raises(ModelError):
        run_job(config, engine_factory=Fake(no_context=True), progress="off", fresh=True)
    assert out.read_bytes() == answers and journal.read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.jsonl.journal.jsonl", "q.jsonl"]
    report = run_job(config, engine_factory=Fake(), progress="off")
    assert report.as_json()["questions"]["from_journal"] == 3
    with pytest.raises(ModelError):
        run_job(replace(config, output=str(tmp_path / "new.jsonl")), engine_factory=Fake(no_context=True),
                progress="off")
    assert not (tmp_path / "new.jsonl").exists()


@pytest.mark.timeout(300)
def test_a_run_ended_by_a_model_error_leaves_the_earlier_report_as_it_was(tmp_path, demo_model):
    """Exit 2 on a model error writes no answers file, so no report either: one saying 0 answered
    of the records would contradict the journal's answers and the answers file left beside it."""
    questions, out, rep = tmp_path / "q.jsonl", tmp_path / "a.jsonl", tmp_path / "rep.json"
    write_lines(questions, [{"questionID": f"q{i}", "question": f"Question {i}?"} for i in range(3)])
    config = build_config([("t", {"model": demo_model, "input": str(questions), "output": str(out),
                                  "report": str(rep), "workers": 1})])
    run_job(config, engine_factory=Fake(), progress="off")
    earlier = rep.read_bytes()
    assert json.loads(earlier)["questions"]["answered"] == 3
    with pytest.raises(ModelError):
        run_job(config, engine_factory=Fake(no_context=True), progress="off", fresh=True)
    assert rep.read_bytes() == earlier
    other = tmp_path / "other.json"
    with pytest.raises(ModelError):
        run_job(replace(config, report=str(other)), engine_factory=Fake(no_context=True), progress="off", fresh=True)
    assert not other.exists()
