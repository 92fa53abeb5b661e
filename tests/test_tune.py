"""Tests for runner.tune's cache: layouts kept per machine, model and context bucket."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from ggbatch.runner.config.schema import JobConfig, build_config
from ggbatch.runner.files.inputs import Record
from ggbatch.runner.model.identity import identify
from ggbatch.runner.plan import layout, tuned
from ggbatch.runner.tools import tune
from helpers import ggbatch_command

SHORT = {"workers": 2, "threads": 1, "slots": 32}
LONG = {"workers": 1, "threads": 2, "slots": 4}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # conftest's cache folder is shared by the whole session; these tests each want an empty one.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "ggbatch" / "layouts.json"


@pytest.fixture
def model(tmp_path: Path) -> str:
    # The key reads the model's identity: a GGUF header (no metadata, no tensors) is enough.
    path = tmp_path / "m.gguf"
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 0) + bytes(range(256)) * 8)
    return str(path)


def records(*questions: str) -> list[Record]:
    return [Record(f"q{i}", {"questionID": f"q{i}", "question": q}, i + 1) for i, q in enumerate(questions)]


def job(model: str, **settings: object) -> JobConfig:
    return build_config([("test", {"model": model, "input": "q.jsonl", "output": "a.json", **settings})])


@pytest.mark.parametrize(("n_ctx_seq", "bucket"), [
    (0, 256), (1, 256), (256, 256), (257, 512), (1000, 1024), (4000, 4096), (4096, 4096), (4097, 8192)])
def test_context_bucket_is_the_power_of_two_above_with_a_floor(n_ctx_seq: int, bucket: int) -> None:
    assert tuned.context_bucket(n_ctx_seq) == bucket


def test_nearest_bucket_by_ratio() -> None:
    assert tuned.nearest_bucket([256, 4096], 300) == 256  # 1.2x from 256, 13.7x from 4096
    # the job's context, not its bucket (512, one doubling from each): 272 is 1.06x from 256, 3.8x from 1024
    for n_ctx_seq in (257, 272, 302, 392, 511):
        assert tuned.nearest_bucket([256, 1024], n_ctx_seq) == 256, n_ctx_seq
    assert tuned.nearest_bucket([256, 1024], 520) == 1024  # 2.03x from 256, 1.97x from 1024
    assert tuned.nearest_bucket([256, 4096], 2100) == 4096
    assert tuned.nearest_bucket([256, 4096], 100_000) == 4096
    assert tuned.nearest_bucket([256, 4096], 1024) == 4096  # equally near: the larger context's
    assert tuned.nearest_bucket([512], 20) == 512  # one saved context serves every job
    assert tuned.nearest_bucket([], 1000) is None


def test_estimate_context() -> None:
    assert layout.estimate_context(3000, 256, None) == 1000 + layout.CHAT_TEMPLATE_TOKENS + 256 + 1
    assert layout.estimate_context(3000, 256, 512) == 512  # the job's own n_ctx wins
    assert layout.estimate_context(0, 32, None) < layout.estimate_context(1, 32, None)


def test_longest_prompt_chars(model: str) -> None:
    recs = records("a" * 10, "b" * 400, "c" * 50)
    assert tuned.longest_prompt_chars(recs, job(model)) == 400
    assert tuned.longest_prompt_chars(recs, job(model, system="s" * 100)) == 500
    assert tuned.longest_prompt_chars([], job(model, system="s" * 100)) == 100
    # A prompt template may use any field: they all count, and so does the template's own text.
    with_context = [Record("x", {"questionID": "x", "question": "q" * 10, "context": "c" * 1000}, 1)]
    template = "Context: {{ context }}\nQuestion: {{ question }}"
    assert tuned.longest_prompt_chars(with_context, job(model)) == 10
    assert tuned.longest_prompt_chars(with_context, job(model, **{"prompt.template": template})) == (
        len(template) + 1 + 10 + 1000)


def test_a_tune_per_context_keeps_the_others(cache: Path, model: str) -> None:
    tuned.save_choice(identify(model), SHORT, [{"n_ctx_per_sequence": 200}], 200)
    tuned.save_choice(identify(model), LONG, [{"n_ctx_per_sequence": 3500}], 3500)
    (entry,) = json.loads(cache.read_text()).values()
    assert list(entry["contexts"]) == ["256", "4096"]
    assert tuned.load_choice(identify(model), 4000) == (4096, LONG)
    assert tuned.load_choice(identify(model), 150) == (256, SHORT)
    tuned.save_choice(identify(model), LONG, [{"n_ctx_per_sequence": 634}], 634)
    assert tuned.load_choice(identify(model), 272) == (256, SHORT)  # 1.06x from 256, 3.8x from 1024
    tuned.save_choice(identify(model), SHORT, [], 4000)  # a new tune at the same context replaces only that one
    assert tuned.load_choice(identify(model), 4000) == (4096, SHORT)
    assert tuned.load_choice(identify(model), 150) == (256, SHORT)


def test_choices_are_per_model(cache: Path, model: str, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(Path(model).read_bytes()[:-1] + b"x")
    tuned.save_choice(identify(model), SHORT, [], 200)
    assert tuned.load_choice(identify(str(other)), 200) is None


def test_a_long_job_gets_the_long_layout(cache: Path, model: str, caplog: pytest.LogCaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tuned.save_choice(identify(model), SHORT, [], 200)
    tuned.save_choice(identify(model), LONG, [], 3500)
    monkeypatch.setattr(logging.getLogger("ggbatch"), "propagate", True)  # the CLI turns it off
    with caplog.at_level(logging.INFO, logger="ggbatch"):
        assert tuned.for_job(job(model, max_tokens=256), identify(model), records("short", "x" * 9000)) == LONG
    assert "tuned for <= 4096 tokens per sequence" in caplog.text and str(cache) in caplog.text
    assert tuned.for_job(job(model, max_tokens=64), identify(model), records("What is 2+2?")) == SHORT
    assert tuned.for_job(job(model, max_tokens=64, **{"model.n_ctx": 4096}), identify(model), records("2+2?")) == LONG
    assert tuned.for_job(job(model, workers=1), identify(model), records("x" * 9000)) is None  # layout set by hand


def test_old_cache_entries_are_ignored_then_replaced(cache: Path, model: str) -> None:
    cache.parent.mkdir(parents=True)
    old = {tuned._key(identify(model)): {"choice": SHORT, "trials": []}, "elsewhere|m": {"choice": LONG, "trials": []}}
    cache.write_text(json.dumps(old))
    assert tuned.load_choice(identify(model), 200) is None  # its context is unknown: not used for any
    tuned.save_choice(identify(model), LONG, [], 200)
    data = json.loads(cache.read_text())
    assert data[tuned._key(identify(model))] == {"contexts": {"256": {"choice": LONG, "trials": []}}}
    assert data["elsewhere|m"] == old["elsewhere|m"]  # other machines' and models' entries are kept


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"k": 3}'])
def test_unreadable_cache_means_no_choice(cache: Path, model: str, text: str) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text(text)
    assert tuned.load_choice(identify(model), 200) is None
    tuned.save_choice(identify(model), SHORT, [], 200)
    assert tuned.load_choice(identify(model), 200) == (256, SHORT)


def test_candidates_skip_slots_the_sample_cannot_fill() -> None:
    def layouts(n_questions: int) -> set[tuple[int, int, int]]:
        return {(c["workers"], c["threads"], c["slots"]) for c in tune.candidates(2, [8, 16, 32, 64], n_questions)}

    # 64 questions: one worker can fill 64 slots, two workers only 32 each.
    assert layouts(64) == {(1, 2, 8), (1, 2, 16), (1, 2, 32), (1, 2, 64), (2, 1, 8), (2, 1, 16), (2, 1, 32)}
    assert (2, 1, 64) in layouts(128)
    # A tiny sample still tries the smallest slot count with every worker count.
    assert layouts(4) == {(1, 2, 8), (2, 1, 8)}


def test_candidates_of_a_batch_invariant_job_are_never_repacked() -> None:
    assert {c["repack"] for c in tune.candidates(2, [8, 16], 64)} == {True, False}
    assert {c["repack"] for c in tune.candidates(2, [8, 16], 64, batch_invariant=True)} == {False}


@pytest.mark.parametrize("seconds,said", [(0.4, "about 5 s"), (23.0, "about 25 s"), (57.0, "about 55 s"),
                                          (58.0, "about 1 min"), (89.0, "about 1 min"), (150.0, "about 2 min"),
                                          (3600.0, "about 60 min")])
def test_the_rough_guess_says_seconds_under_a_minute(seconds: float, said: str) -> None:
    assert tune.said_duration(seconds) == said


def tune_cli(tmp_path: Path, *args: object, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`ggbatch tune` with its layouts in tmp_path's own cache folder (or `cache`), on 2 sample
    questions of 2 tokens at 2 slots: a few seconds."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache or tmp_path / "xdg")}
    return subprocess.run(ggbatch_command("tune", *args, "--max-tokens", 2, "--slots", 2), cwd=ROOT,
                          capture_output=True, text=True, timeout=200, env=env)


@pytest.mark.model
def test_tune_writes_none_of_the_job_s_files(tmp_path: Path, stories: str) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"model: {stories}\ninput: q.jsonl\noutput: out.jsonl\nerrors_output: errors.jsonl\n")
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"questionID": f"q{i}", "question": "Hi?"}) + "\n"
                                              for i in range(2)))
    (tmp_path / "errors.jsonl").write_text("the user's own rows\n")
    done = tune_cli(tmp_path, job_file, "--questions", 2)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "errors.jsonl").read_text() == "the user's own rows\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors.jsonl", "job.yaml", "q.jsonl", "xdg"]


@pytest.mark.model
def test_tune_samples_a_csv_jobs_own_questions_and_tries_layouts_here(tmp_path: Path, stories: str) -> None:
    # the job's input, read in the job's format (its name says nothing), then tune's own JSONL
    # sample; the trials run in local processes whatever the job's backend (no Ray cluster here)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"model: {stories}\ninput: q.txt\ninput_format: csv\noutput: out.csv\noutput_format: csv\n"
                        "fields:\n  id: id\n  question: text\nbackend: ray\nray_address: 127.0.0.1:9\n")
    (tmp_path / "q.txt").write_text("id,text\na,Hello?\nb,Once upon a time\nc,The end?\n")
    done = tune_cli(tmp_path, job_file, "--questions", 10)
    assert done.returncode == 0, done.stderr
    assert " on 3 questions (all the file holds; --questions 10)" in done.stdout.splitlines()[0]
    assert "fastest:" in done.stdout
    (tmp_path / "q.txt").write_text("id,text\n")
    empty = tune_cli(tmp_path, job_file, "--questions", 10)
    assert empty.returncode == 2 and f"{tmp_path / 'q.txt'}: no questions to sample" in empty.stderr, empty.stderr


@pytest.mark.model
def test_tune_saves_nothing_when_no_trial_generated_a_token(tmp_path: Path, stories: str) -> None:
    # questions longer than the model's context each fail: every rate is 0, no layout is fastest
    questions = tmp_path / "long.jsonl"
    questions.write_text("".join(json.dumps({"questionID": f"q{i}", "question": "word " * 2000}) + "\n"
                                 for i in range(2)))
    done = tune_cli(tmp_path, "--model", stories, "--input", questions, "--questions", 2)
    assert done.returncode == 1, done.stderr
    assert "no trial generated a token" in done.stderr and "no layout saved" in done.stderr
    assert "fastest" not in done.stdout and not (tmp_path / "xdg" / "ggbatch" / "layouts.json").exists()


@pytest.mark.model
def test_tune_says_how_many_questions_it_samples(tmp_path: Path, stories: str) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"questionID": f"q{i}", "question": "Hi?"}) + "\n" for i in range(3)))
    done = tune_cli(tmp_path, "--model", stories, "--input", questions, "--questions", 100)
    assert done.returncode == 0, done.stderr
    assert " on 3 questions (all the file holds; --questions 100) × 2 tokens" in done.stdout.splitlines()[0]
    for flag, bad in (("--questions", "0"), ("--questions", "-5"), ("--max-tokens", "0"), ("--max-tokens", "-3")):
        refused = tune_cli(tmp_path, "--model", stories, flag, bad)
        assert refused.returncode == 2
        assert refused.stderr == (f"ggbatch tune: error: argument {flag}: expected an integer >= 1, got '{bad}' "
                                  "(`ggbatch tune --help` lists the options)\n")


@pytest.mark.model
def test_tune_refuses_a_cache_folder_it_cannot_make_before_any_trial(tmp_path: Path, stories: str) -> None:
    (tmp_path / "a_file").write_text("x")
    done = tune_cli(tmp_path, "--model", stories, "--questions", 2, cache=tmp_path / "a_file")
    assert done.returncode == 2
    assert done.stderr == (f"ggbatch: error: tune: cannot save the layout in ggbatch's cache folder "
                           f"{tmp_path / 'a_file' / 'ggbatch'} (Not a directory: {tmp_path / 'a_file' / 'ggbatch'}): "
                           "set XDG_CACHE_HOME to a folder this user can write\n")
    assert done.stdout == ""  # no trial ran


@pytest.mark.model
@pytest.mark.timeout(200)
@pytest.mark.parametrize("key, said", [("answer:\n  json_schema: {type: frob}\n", "answer.json_schema: cannot turn"),
                                       ("answer:\n  grammar: 'root ::= foo'\n", "answer.grammar: not a grammar"),
                                       ("prompt:\n  template: '{% if %}'\n", "prompt.template: line 1: ")])
def test_tune_names_the_job_file_of_a_key_refused_as_it_is_used(tmp_path: Path, stories: str, key: str,
                                                                 said: str) -> None:
    """`ggbatch run job.yaml` says `job.yaml: answer.json_schema: ...`; tune said the key alone."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"model: {stories}\ninput: q.jsonl\noutput: out.jsonl\n{key}")
    (tmp_path / "q.jsonl").write_text(json.dumps({"questionID": "a", "question": "Hi?"}) + "\n")
    done = tune_cli(tmp_path, job_file, "--questions", 1)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"ggbatch: error: {job_file}: {said}"), done.stderr


@pytest.mark.model
@pytest.mark.timeout(200)
@pytest.mark.parametrize("slots, said", [("1,300", "--slots: at most 255 slots per worker (llama.cpp's 256 sequences "
                                                    "per context, less the one of the shared prefix), got 300"),
                                         ("0,4", "--slots: expected integers >= 1, got '0,4'")])
def test_tune_refuses_slots_past_the_limit_before_any_trial(tmp_path: Path, stories: str, slots: str,
                                                             said: str) -> None:
    # --slots 1,300 ran the 1-slot trials, then died refusing 300 and saved nothing
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    done = subprocess.run(ggbatch_command("tune", "--model", stories, "--questions", 2, "--max-tokens", 2,
                                          "--slots", slots), cwd=ROOT, capture_output=True, text=True,
                          timeout=200, env=env)
    assert done.returncode == 2
    assert done.stderr == f"ggbatch: error: {said}\n"
    assert done.stdout == ""  # no trial ran
