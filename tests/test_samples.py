"""n samples per question (sampling.n, an OpenAI line's n): the prompt is computed once and its KV
serves every sample; sample i draws with the seed sample_seed(question seed, i), so it is the
answer the question gets alone with that seed, on attention memory and on recurrent and hybrid
memory alike; the scheduler holds a slot for each sample."""

from __future__ import annotations

import json
from array import array
from dataclasses import replace

import pytest

from ggbatch.runner.model.make import modelgen as mg
from ggbatch.runner.plan.repack import model_is_hybrid
from ggbatch.workers.engine.samples import SampleSet, sample_seed
from ggbatch.workers.engine.scheduler import Scheduler
from ggbatch.workers.engine.sequence import Sequence
from ggbatch.workers.protocol import Answer, EngineConfig, FinishReason, GenerationParams, Question, SamplingParams
from helpers import engine_run, repack_runs

SAMPLED = SamplingParams(temperature=0.9, top_k=40)


# -- pure -----------------------------------------------------------------------------------------


def test_sample_seeds_start_from_the_questions_own():
    assert sample_seed(77, 0) == 77 and sample_seed(77, 3) == 80
    assert sample_seed(2**64 - 1, 1) == 0  # stays a 64-bit seed


def test_the_scheduler_holds_a_slot_for_each_sample_and_gives_unforked_ones_back():
    sched = Scheduler(4, 64)
    first = Sequence(Question("a", array("i", [1, 2, 3]), 0), samples=SampleSet(3))
    second = Sequence(Question("b", array("i", [1, 2, 4]), 0), samples=SampleSet(2))
    sched.add(first)
    sched.add(second)
    assert sched.admit() == [first]  # b waits: one slot is free, it needs two
    assert (first.seq_id, first.fork_ids, sched.free_ids) == (0, [1, 2], [3])
    sched.release(first)  # failed before its prompt was in
    assert sorted(sched.free_ids) == [0, 1, 2, 3] and first.fork_ids == []
    assert sched.admit() == [second]


def test_the_answer_comes_with_the_last_sample_in_sample_order():
    samples = SampleSet(3, forked=True)

    def answer(text: str, tokens: int) -> Answer:
        return Answer(qid="q", text=text, finish_reason=FinishReason.STOP, prompt_tokens=5, completion_tokens=tokens,
                      worker_id=0, ttft_s=0.1, latency_s=0.2 * tokens)

    assert samples.finished(2, answer("c", 3)) is None
    assert samples.finished(0, answer("a", 1)) is None
    whole = samples.finished(1, answer("b", 2))
    assert whole is not None and [s.text for s in whole.samples] == ["a", "b", "c"]
    assert (whole.text, whole.completion_tokens, whole.prompt_tokens) == ("a", 6, 5)
    assert whole.latency_s == pytest.approx(0.6)  # the last sample's


# -- on a model -------------------------------------------------------------------------------------


def run(model: str, questions: list[Question], slots: int, stats: dict | None = None, **gen) -> dict[str, Answer]:
    # Weights as the plan lays them out: never repacked on a hybrid model (llama.cpp mixed its
    # sequences so), nor where this CPU refuses the repacked kernels.
    repack = not model_is_hybrid(model) and repack_runs()
    config = EngineConfig(model_path=model, n_threads=1, slots=slots, n_ctx_seq=64, n_batch=128,
                          generation=GenerationParams(**gen), kv_unified=False,
                          repack=repack)
    return engine_run(config, questions, stats)


def prompts() -> list[Question]:
    return [Question(f"q{i}", array("i", [1, 30 + i, 50 + 2 * i, 9, 70 + i, 11]), 1000 + i) for i in range(3)]


def check_samples_are_answers_alone(model: str, n: int, slots: int) -> None:
    many_stats: dict = {}
    many = run(model, prompts(), slots, many_stats, max_tokens=8, ignore_eos=True,
               sampling=replace(SAMPLED, n=n), token_logprobs=1)
    one_stats: dict = {}
    alone = [Question(f"{q.qid}/{i}", q.tokens, sample_seed(q.seed, i)) for q in prompts() for i in range(n)]
    ones = run(model, alone, slots, one_stats, max_tokens=8, ignore_eos=True, sampling=SAMPLED, token_logprobs=1)
    for q in prompts():
        got = many[q.qid]
        assert got.samples is not None and len(got.samples) == n and got.completion_tokens == 8 * n
        assert got.text == got.samples[0].text
        for i, sample in enumerate(got.samples):
            assert sample.text == ones[f"{q.qid}/{i}"].text, (q.qid, i)
            assert sample.token_logprobs is not None and len(sample.token_logprobs) == 8
        assert len({s.text for s in got.samples}) > 1  # sampled: not n copies of one answer
    # each prompt computed once, not once per sample
    assert many_stats["prompt_computed"] == sum(len(q.tokens) for q in prompts())
    assert many_stats["sample_forks"] == (n - 1) * len(prompts())


@pytest.mark.model
@pytest.mark.timeout(180)
@pytest.mark.parametrize("slots", [4, 9])
def test_each_sample_is_the_answer_alone_with_its_seed_and_the_prompt_is_computed_once(demo_model, slots):
    check_samples_are_answers_alone(demo_model, 4, slots)


@pytest.fixture(scope="module")
def recurrent_models(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("recurrent")
    return {name: str(mg.make_model(folder / f"{name}.gguf", name)) for name in ("mamba2-tiny", "lfm2-tiny")}


@pytest.mark.model
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["mamba2-tiny", "lfm2-tiny"])
def test_on_recurrent_and_hybrid_memory_samples_fork_from_the_whole_state(recurrent_models, name):
    check_samples_are_answers_alone(recurrent_models[name], 3, 4)


@pytest.mark.model
@pytest.mark.timeout(120)
def test_more_samples_than_slots_is_that_questions_error(demo_model):
    got = run(demo_model, prompts()[:1], 2, max_tokens=4, sampling=replace(SAMPLED, n=3))
    assert got["q0"].error.startswith("n: 3 samples decode together, a slot each, and the worker has 2 slots")


# -- scoring ----------------------------------------------------------------------------------------


def test_pass_at_k_is_chen_et_als_unbiased_estimator():
    from math import comb

    from ggbatch.runner.scoring.samples import majority, pass_at_k

    for n, c, k in [(8, 0, 1), (8, 3, 1), (8, 3, 4), (8, 7, 2), (10, 5, 8), (5, 5, 5)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    assert majority(["7", "[invalid]", "5", "5", "7"]) == "7"  # a tie goes to the first seen, as lm-eval's vote


def test_score_reports_maj_and_pass_at_k_from_every_answers_format(tmp_path):
    import csv

    from ggbatch.runner.scoring.command import score_files
    from ggbatch.runner.scoring.table import format_table, summary
    from helpers import write_jsonl

    gold = write_jsonl(tmp_path / "gold.jsonl", [{"questionID": "a", "answer": "5"},
                                                {"questionID": "b", "answer": "7"}])
    rows = [{"questionID": "a", "answer": ["It is 5.", "It is 6.", "5", "no idea"]},
            {"questionID": "b", "answer": ["8", "7", "9", "8"]}]
    jsonl = write_jsonl(tmp_path / "answers.jsonl", rows)
    with open(tmp_path / "answers.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["questionID", "answer", "error", "samples"])
        w.writerows([[r["questionID"], json.dumps(r["answer"]), "", 4] for r in rows])
    for path in (jsonl, tmp_path / "answers.csv"):
        result = score_files(str(path), str(gold))
        got = summary(result)
        assert got["overall"]["correct"] == 1  # the first samples: 5 right, 8 wrong
        assert got["samples"]["maj@4"] == 0.5 and got["samples"]["k"] == 4  # a: 5 wins; b: 8 wins
        assert got["samples"]["pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
        assert got["samples"]["pass@4"] == 1.0
        assert "maj@4 50.00%" in format_table(result)


# -- a whole run ------------------------------------------------------------------------------------


def run_job(model, questions, out, *extra):
    from helpers import ggbatch

    return ggbatch("run", "--model", model, "--input", questions, "--output", out, "--max-tokens", 6, "--ignore-eos",
                   "--progress", "off", "--workers", 1, "--threads", 1, *extra)


@pytest.mark.model
@pytest.mark.timeout(300)
def test_n_samples_compute_the_prompts_once_and_resume_and_rerun_the_same(demo_model, questions_file, tmp_path):
    questions = questions_file(4)
    reports = {}
    for n in (1, 8):
        out, report = tmp_path / f"n{n}.jsonl", tmp_path / f"n{n}.report.json"
        done = run_job(demo_model, questions, out, "--temperature", "0.8", "--n", n, "--report", report)
        assert done.returncode == 0, done.stderr
        reports[n] = json.loads(report.read_text())
    cache = {n: r["prefix_cache"] for n, r in reports.items()}
    assert cache[8]["prompt_tokens_computed"] <= cache[1]["prompt_tokens_computed"]
    assert cache[8]["sample_forks"] == 7 * 4 and reports[8]["layout"]["slots_per_worker"] >= 8
    # the timeline's prompt tokens are the same count (they missed a token for each forked sample)
    assert [reports[n]["timeline"][-1]["prompt_tokens"] for n in (1, 8)] == [c["prompt_tokens_computed"]
                                                                             for c in cache.values()]
    rows = [json.loads(line) for line in (tmp_path / "n8.jsonl").read_text().splitlines()]
    assert all(isinstance(r["answer"], list) and len(r["answer"]) == 8 for r in rows)
    one = [json.loads(line) for line in (tmp_path / "n1.jsonl").read_text().splitlines()]
    assert [r["answer"][0] for r in rows] == [r["answer"] for r in one]  # sample 0 is the n = 1 answer

    resumed = run_job(demo_model, questions, tmp_path / "n8.jsonl", "--temperature", "0.8", "--n", 8)
    assert resumed.returncode == 0, resumed.stderr
    assert [json.loads(line) for line in (tmp_path / "n8.jsonl").read_text().splitlines()] == rows
    again = tmp_path / "again.csv"  # a fresh run, another layout, CSV
    assert run_job(demo_model, questions, again, "--temperature", "0.8", "--n", 8, "--slots", 12).returncode == 0
    import csv
    cells = list(csv.DictReader(again.open(newline="")))
    assert [json.loads(c["answer"]) for c in cells] == [r["answer"] for r in rows]
    assert {c["samples"] for c in cells} == {"8"}


@pytest.mark.model
@pytest.mark.timeout(120)
def test_greedy_samples_are_refused_naming_the_key(demo_model, questions_file, tmp_path):
    done = run_job(demo_model, questions_file(2), tmp_path / "a.jsonl", "--n", 3)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "ggbatch: error: sampling.n: 3 samples need sampling.temperature > 0 (--temperature)")


@pytest.mark.model
@pytest.mark.timeout(300)
def test_openai_lines_with_n_get_indexed_choices(demo_model, tmp_path):
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    from helpers import write_jsonl

    def chat(qid, **body):
        return {"custom_id": qid, "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "Tell a story"}], "max_tokens": 5, **body}}

    lines = [chat("three", n=3, temperature=0.7, logprobs=True),
             chat("greedy", n=2),
             {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "Once upon a time", "max_tokens": 5, "n": 2, "temperature": 1.0}}]
    out = tmp_path / "out.jsonl"
    done = run_job(demo_model, write_jsonl(tmp_path / "batch.jsonl", lines), out)
    assert done.returncode == 1, done.stderr  # the greedy line is refused
    got = {row["custom_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    three = ChatCompletion.model_validate(got["three"]["response"]["body"])
    assert [c.index for c in three.choices] == [0, 1, 2] and all(c.logprobs.content for c in three.choices)
    assert three.usage.completion_tokens == 15
    assert got["greedy"]["error"]["message"].startswith("body.n: 2 samples need a temperature > 0")
    cmpl = Completion.model_validate(got["cmpl"]["response"]["body"])
    assert [c.index for c in cmpl.choices] == [0, 1]


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_line_asking_past_the_auto_slots_gets_them_and_past_fixed_slots_fails_alone(demo_model, tmp_path):
    """Auto slots cover the most samples a line asks for, past their usual cap of 64; with --slots
    fixed below it, that line fails with its own error and the rest of the file is answered."""
    from helpers import write_jsonl

    def chat(qid, n):
        return {"custom_id": qid, "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "Tell a story"}], "max_tokens": 2, "n": n,
                         "temperature": 0.7}}

    batch = write_jsonl(tmp_path / "batch.jsonl", [chat("many", 70), chat("two", 2)])
    out = tmp_path / "out.jsonl"
    assert run_job(demo_model, batch, out).returncode == 0
    got = {row["custom_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert len(got["many"]["response"]["body"]["choices"]) == 70
    assert run_job(demo_model, batch, out, "--slots", 4, "--fresh").returncode == 1
    got = {row["custom_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert "70 samples" in got["many"]["error"]["message"] and got["many"]["response"] is None
    assert len(got["two"]["response"]["body"]["choices"]) == 2


def test_a_cut_sample_keeps_the_others_and_only_all_cut_or_a_crash_fails_the_question():
    def answer(text: str, error: str | None = None, finish: FinishReason = FinishReason.STOP) -> Answer:
        return Answer(qid="q", text="" if error else text, finish_reason=finish, prompt_tokens=5, completion_tokens=2,
                      error=error)

    cut = answer("", "max_tokens (4) ran out", FinishReason.LENGTH)
    mixed = SampleSet(3, forked=True)
    for i, a in enumerate([answer("yes"), cut, answer("no")]):
        whole = mixed.finished(i, a)
    assert whole is not None and whole.error is None and whole.finish_reason is FinishReason.STOP
    assert [(s.text, s.error) for s in whole.samples] == [("yes", None), ("", "max_tokens (4) ran out"), ("no", None)]
    all_cut = SampleSet(2, forked=True)
    all_cut.finished(0, cut)
    failed = all_cut.finished(1, cut)
    assert failed.error == "max_tokens (4) ran out" and failed.finish_reason is FinishReason.LENGTH
    crashed = SampleSet(2, forked=True)
    crashed.finished(0, answer("yes"))
    broken = crashed.finished(1, answer("", "decode failed", FinishReason.ERROR))
    assert broken.error == "decode failed" and broken.finish_reason is FinishReason.ERROR


def test_a_sample_without_an_answer_is_null_in_rows_and_kept_by_the_journal():
    from ggbatch.runner.files.formats.rows import Row, row_fields
    from ggbatch.runner.journal.entries import answer_of, entry_of
    from ggbatch.workers.protocol import Sample

    samples = (Sample("yes", FinishReason.STOP, 1), Sample("", FinishReason.LENGTH, 4, error="cut"),
               Sample("of", FinishReason.LENGTH, 4, in_thinking=True))
    answer = Answer(qid="q", text="yes", finish_reason=FinishReason.STOP, prompt_tokens=5, completion_tokens=9,
                    samples=samples)
    assert row_fields(Row("q", answer, None), "questionID", False) == {"questionID": "q", "answer": ["yes", None, ""]}
    assert answer_of(entry_of(answer, "p", "r")).samples == samples


GRAMMAR = 'root ::= "yes" | "no, because of many many reasons"'  # "yes" ends in time, the other is cut


@pytest.mark.model
@pytest.mark.timeout(300)
def test_samples_cut_before_their_grammar_is_complete_are_null_and_the_others_answer(demo_model, tmp_path):
    from helpers import ggbatch

    questions, out = tmp_path / "q.jsonl", tmp_path / "a.jsonl"
    questions.write_text("".join(json.dumps({"questionID": f"q{i}", "question": f"Is {i} even?", "answer": "yes"})
                                 + "\n" for i in range(6)))
    done = ggbatch("run", "--model", demo_model, "--input", questions, "--output", out, "--max-tokens", 4,
                   "--n", 6, "--temperature", 1, "--grammar", GRAMMAR, "--progress", "off")
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line)["answer"] for line in out.read_text().splitlines()]
    flat = [a for row in answers for a in row]
    assert set(flat) == {"yes", None}, answers  # both happen: the test means something
    cut = flat.count(None)
    assert f"{cut} samples held to choices or a grammar were cut before they were complete" in done.stderr
    score = ggbatch("score", "--answers", out, "--gold", questions, "--extract", "exact")
    assert score.returncode == 0, score.stderr
    rows = [line.split() for line in score.stdout.splitlines()]
    assert ["all", "6", str(sum(row[0] == "yes" for row in answers)), ] == rows[2][:3]  # a null first sample: wrong
    # a null is one invalid vote (ties go to the value seen first) and a wrong sample for pass@k
    maj = sum(row.count("yes") > row.count(None) or (row.count("yes") == row.count(None) and row[0] == "yes")
              for row in answers)
    pass1 = sum(row.count("yes") / 6 for row in answers) / 6
    assert f"maj@6 {100 * maj / 6:.2f}% ({maj} correct by majority vote), pass@1 {100 * pass1:.2f}%" in score.stdout


@pytest.mark.model
@pytest.mark.timeout(180)
def test_a_seed_llama_cpp_reads_as_random_draws_the_same_answer_on_every_run(demo_model):
    """llama.cpp draws at random with the seed 0xFFFFFFFF: an OpenAI line's -1 or 4294967295, a
    question's crc32 or a sample's seed + i that lands there draws as 0x7FFFFFFF instead, every run;
    seeds are read modulo 2**32, so 5 and 2**32 + 5 draw alike, as they always did."""
    tokens = prompts()[0].tokens
    seeds = {"top": 2**32 - 1, "minus_one": -1, "top_wrapped": 2**33 - 1, "standin": 0x7FFFFFFF, "five": 5,
             "five_wrapped": 2**32 + 5}
    got = run(demo_model, [Question(k, tokens, s) for k, s in seeds.items()], 6, max_tokens=12,
              ignore_eos=True, sampling=SAMPLED)
    texts = {k: a.text for k, a in got.items()}
    assert texts["top"] == texts["minus_one"] == texts["top_wrapped"] == texts["standin"], texts
    assert texts["five"] == texts["five_wrapped"] != texts["top"]
    # sample 1 of a question seeded 0xFFFFFFFE is the seed 0xFFFFFFFF's draw; sample 2 wraps to 0
    edge = run(demo_model, [Question("edge", tokens, 2**32 - 2)], 3, max_tokens=12, ignore_eos=True,
               sampling=replace(SAMPLED, n=3))["edge"]
    assert edge.samples is not None and edge.samples[1].text == texts["top"]
    zero = run(demo_model, [Question("zero", tokens, 0)], 1, max_tokens=12, ignore_eos=True, sampling=SAMPLED)
    assert edge.samples[2].text == zero["zero"].text != texts["top"]
