"""The prefix cache through the whole job on a real model (the generated demo model): questions sharing
passages, shuffled, answered exactly as without the cache, with far fewer prompt tokens computed,
and nothing lost when a worker holding cached passages is killed."""

import json
import os
import random
import signal
import subprocess

import pytest

from conftest import ROOT
from helpers import ggbatch_command, journal_entries, journaled, wait_for, write_jsonl
from test_faults import workers_of

pytestmark = [pytest.mark.timeout(240), pytest.mark.model]

N_PASSAGES, PER_PASSAGE = 8, 6


def passage_file(path, seed=4):
    rng = random.Random(seed)
    words = "the a cat dog ran sat big small red blue tree house little girl boy happy sad".split()
    passages = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(N_PASSAGES)]
    rows = [{"questionID": f"p{p}-q{j}", "question": f"Story: {text}\nQuestion {j}: what did the "
                                                        f"{rng.choice(words)} do next?"}
            for p, text in enumerate(passages) for j in range(PER_PASSAGE)]
    rng.shuffle(rows)
    return write_jsonl(path, rows)


def run(model, questions, out, *extra, timeout=180):
    args = ggbatch_command("run", "--model", model, "--input", questions, "--output", out, "--report",
                           f"{out}.report.json", "--workers", 2, "--slots", 4, "--max-tokens", 24,
                           "--batch-invariant", "--progress", "off", *extra)
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(open(f"{out}.report.json").read())


@pytest.fixture(scope="module")
def quiet(tmp_path_factory, demo_model):
    folder = tmp_path_factory.mktemp("prefix")
    questions = passage_file(folder / "q.jsonl")
    off = run(demo_model, questions, folder / "off.json", "--prefix-cache", "off")
    on = run(demo_model, questions, folder / "on.json")
    return questions, folder, off, on


def test_the_cache_gives_the_same_answers_and_computes_most_passages_once(quiet):
    questions, folder, off, on = quiet
    assert (folder / "on.json").read_bytes() == (folder / "off.json").read_bytes()
    cache = on["prefix_cache"]
    assert cache["mode"] == "auto" and cache["active"] and on["layout"]["kv"] == "per-sequence"
    assert cache["groups"] == N_PASSAGES and cache["grouped_questions"] == N_PASSAGES * PER_PASSAGE
    assert cache["prompt_tokens"] == off["prefix_cache"]["prompt_tokens"] > 0
    # 6 questions a passage, two workers: each passage about once per worker that gets it
    assert cache["computed_share"] < 0.45, cache
    assert cache["hits"] > 0 and cache["kept_mib_peak"] > 0
    assert not off["prefix_cache"]["active"] and off["prefix_cache"]["computed_share"] > 0.95


@pytest.mark.slow
def test_a_worker_killed_while_it_holds_cached_passages_loses_nothing(quiet, tmp_path, demo_model):
    questions, folder, _, _ = quiet
    out = tmp_path / "answers.json"
    args = ggbatch_command("run", "--model", demo_model, "--input", questions, "--output", out, "--workers", 2,
                           "--slots", 4, "--max-tokens", 24, "--batch-invariant", "--progress", "log")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: journal_entries(out) >= 4 or proc.poll() is not None, what="some answers")
    victims = workers_of(proc)
    assert victims and proc.poll() is None, "the job finished before a worker could be killed"
    os.kill(victims[0].pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert "died (signal 9)" in stderr
    assert out.read_bytes() == (folder / "on.json").read_bytes()
    ids = [e["qid"] for e in journaled(f"{out}.journal.jsonl")]
    assert len(ids) == len(set(ids)) == N_PASSAGES * PER_PASSAGE


def test_questions_too_long_for_the_context_share_nothing(tmp_path, demo_model):
    """A question no context of the job can take is turned away by every worker unread: its
    passage, shared with others as long, saves nothing, and the log and report do not count it."""
    rng = random.Random(7)
    words = "the a cat dog ran sat big small red blue tree house little girl boy happy sad".split()
    rows = [{"questionID": f"{size}{p}-q{j}", "question": f"Story: {text}\nQuestion {j}: what did the dog do?"}
            for size, n_words in (("short", 40), ("long", 200)) for p in range(2)
            for text in [" ".join(rng.choice(words) for _ in range(n_words))] for j in range(3)]
    questions, out = write_jsonl(tmp_path / "q.jsonl", rows), tmp_path / "a.json"
    done = subprocess.run(ggbatch_command("run", "--model", demo_model, "--input", questions, "--output", out,
                                          "--report", tmp_path / "r.json", "--n-ctx", 128, "--max-tokens", 8,
                                          "--workers", 1, "--progress", "off"),
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr  # the long questions failed, each alone
    answers = {r["questionID"]: r for r in json.loads(out.read_text())}
    assert all(("context per sequence is 128" in (a.get("error") or "")) == qid.startswith("long")
               for qid, a in answers.items()), answers
    cache = json.loads((tmp_path / "r.json").read_text())["prefix_cache"]
    assert (cache["groups"], cache["grouped_questions"]) == (2, 6)  # the short passages' questions
    assert 0 < cache["shareable_tokens"] < cache["prompt_tokens"]
    assert "2 groups of questions share a prefix (6 questions;" in done.stderr


def _one_passage_job(tmp_path, model, name):
    passage = "Passage: The quick brown fox jumps over the lazy dog near the river bank every morning."
    rows = [{"questionID": f"p{i}", "question": f"{passage} {q}"} for i, q in enumerate(("Who?", "When?", "Where?"))]
    questions = write_jsonl(tmp_path / "q.jsonl", rows + [{"questionID": "x", "question": "Something else"}])
    done = subprocess.run(ggbatch_command("run", "--model", model, "--input", questions, "--output",
                                          tmp_path / f"{name}.jsonl", "--report", tmp_path / f"{name}.json",
                                          "--max-tokens", 2, "--progress", "off"),
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stderr, json.loads((tmp_path / f"{name}.json").read_text())["prefix_cache"]


def test_the_log_claims_the_groups_saving_only_where_the_models_memory_lets_the_cache_run(
        demo_model, arch_models, tmp_path):
    said, cache = _one_passage_job(tmp_path, demo_model, "demo")
    assert cache["active"] and cache["groups"] == 1
    line = next(x for x in said.splitlines() if "prefix cache: " in x)
    assert f"1 group of questions shares a prefix (3 questions; {cache['shareable_tokens']} prompt tokens" in line
    # recurrent memory: the cache is off, the workers' note says so, and no saving is claimed
    said, cache = _one_passage_job(tmp_path, arch_models["mamba2-tiny"], "mamba2")
    assert not cache["active"] and cache["hits"] == 0
    assert "need not be computed again" not in said and said.count("the prefix cache is off") == 1, said


def test_the_groups_line_waits_for_the_models_memory(caplog):
    from ggbatch.runner.questions.prefix_groups import Sharing
    from ggbatch.runner.questions.prepare import SharingNote

    caplog.set_level("INFO", logger="ggbatch")
    for memory, said in (("attention", 2), ("hybrid", 0), ("recurrent", 0)):
        caplog.clear()
        note = SharingNote()
        note.add(Sharing(1, 3, 96))
        note.add(Sharing(2, 5, 40))
        assert not caplog.records  # not known yet: nothing said
        note.memory_known(memory)
        note.memory_known("attention")  # the first worker's word counts
        note.add(Sharing(1, 2, 10))  # a later window, said as it comes
        assert [r.getMessage() for r in caplog.records][:1] == (
            ["prefix cache: 3 groups of questions share a prefix (8 questions; 136 prompt tokens need not be "
             "computed again)"] if said else [])
        assert len(caplog.records) == said
