"""answer.choice_scoring: loglikelihood end to end on a real model: each choice's text a
continuation of the rendered prompt, tokenized by lm-eval's rule; every choice's sum within 0.01
nats of llama-cpp-python's own (`Llama(logits_all=True)` over context + continuation); the answer
lm-eval's acc pick and answer_norm its acc_norm pick in JSON Lines and CSV; choices: auto; a
resumed job writing the same file; the prompt computed once for all its choices; the error
without choices."""

import csv
import json
import random
from pathlib import Path

import pytest

from helpers import JOURNAL_HEAD, STORY_WORDS, ggbatch, write_jsonl
from test_loglik import TOLERANCE, reference

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]

CHOICES = ["cat", "big red dog", "a"]


def story_records(n: int, auto: bool = False, seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        row = {"questionID": f"s{i}", "question": "Once upon a time " + " ".join(rng.choice(STORY_WORDS)
                                                                               for _ in range(rng.randint(20, 40)))}
        if auto:  # each record its own choices, of unequal lengths
            row["choices"] = rng.sample(["the girl", "happy", "sat in the house", "tree", "blue boy ran"],
                                        rng.randint(2, 4))
        rows.append(row)
    return rows


def run(model, questions, out, *extra, timeout=240):
    return ggbatch("run", "--model", model, "--input", questions, "--output", out, "--chat-template", "plain",
                   "--workers", 1, "--threads", 1, *extra, timeout=timeout)


def expected(model: str, records: list[dict], fixed: list[str] | None) -> dict[str, dict[str, float]]:
    """Each record's choice sums by llama-cpp-python: the plain template's prompt as the context,
    " " + choice as the continuation, encoded together and split at the context's length."""
    from llama_cpp import Llama

    vocab = Llama(model_path=model, vocab_only=True, verbose=False)
    pairs, owners = [], []
    for rec in records:
        context = f"Question: {rec['question']}\nAnswer:"
        ctx = vocab.tokenize(context.encode(), add_bos=True)
        for choice in fixed or rec["choices"]:
            whole = vocab.tokenize(f"{context} {choice}".encode(), add_bos=True)
            pairs.append((ctx, whole[len(ctx):]))
            owners.append((rec["questionID"], choice))
    out: dict[str, dict[str, float]] = {}
    for (qid, choice), (logprobs, _) in zip(owners, reference(model, pairs)):
        out.setdefault(qid, {})[choice] = sum(logprobs)
    return out


def rows_of(path: Path) -> dict[str, dict]:
    return {r["questionID"]: r for r in map(json.loads, path.read_text().splitlines())}


def check_picks(rows: dict[str, dict], sums: dict[str, dict[str, float]]) -> None:
    """The answer is the highest sum's choice, answer_norm the highest sum per character's."""
    for qid, want in sums.items():
        row = rows[qid]
        assert row["answer"] == max(want, key=want.get)
        assert row["answer_norm"] == max(want, key=lambda c: want[c] / len(c))


def test_sums_match_llama_cpp_python_and_the_picks_are_acc_and_acc_norm(tmp_path, stories):
    records = story_records(10)
    q = write_jsonl(tmp_path / "q.jsonl", records)
    out = tmp_path / "a.jsonl"
    r = run(stories, q, out, "--choices", ",".join(CHOICES), "--choice-scoring", "loglikelihood",
            "--choice-logprobs", "--report", tmp_path / "rep.json")
    assert r.returncode == 0, r.stderr
    rows, sums = rows_of(out), expected(stories, records, CHOICES)
    worst = max(abs(rows[qid]["choice_logprobs"][c] - v) for qid, want in sums.items() for c, v in want.items())
    assert worst < TOLERANCE
    assert all(list(rows[qid]["choice_logprobs"]) == CHOICES for qid in sums)
    check_picks(rows, sums)
    # the picks differ somewhere, or the test could not tell answer from answer_norm
    assert any(row["answer"] != row["answer_norm"] for row in rows.values())
    rep = json.loads((tmp_path / "rep.json").read_text())
    cache = rep["prefix_cache"]
    # prompt_tokens counts each context once and every choice's tokens: computed, the context's
    # last token comes again for each choice (its logits score the choice's first token), and no
    # more: the context is computed once for its three choices, not three times
    assert cache["prompt_tokens_computed"] <= cache["prompt_tokens"] + len(CHOICES) * len(records)
    assert rep["generation"]["answer"]["choice_scoring"] == "loglikelihood"


def test_with_the_prefix_cache_off_the_summary_says_what_the_choices_computed(tmp_path, stories):
    # batch-invariant, each choice of several tokens computes its prompt (no fork from the first):
    # more than the prompts hold, which the summary says (it said nothing of it without the cache)
    q = write_jsonl(tmp_path / "q.jsonl", story_records(4))
    r = run(stories, q, tmp_path / "a.jsonl", "--choices", ",".join(CHOICES), "--choice-scoring", "loglikelihood",
            "--prefix-cache", "off", "--batch-invariant", "--report", tmp_path / "rep.json")
    assert r.returncode == 0, r.stderr
    cache = json.loads((tmp_path / "rep.json").read_text())["prefix_cache"]
    assert cache["prompt_tokens_computed"] > cache["prompt_tokens"]
    share = 100 * cache["computed_share"]
    said = f"{share:.0f}% of the questions' prompt tokens computed (prefix cache off)"
    assert said in r.stdout + r.stderr, r.stdout


def test_a_prompt_is_computed_once_for_its_choices_with_the_prefix_cache_off(tmp_path, stories):
    # the other choices fork from the first one's KV: the prompt once, each choice its own tokens
    # and the prompt's last one, as with the cache; the sums as with the cache, bit for bit
    records = story_records(6)
    q = write_jsonl(tmp_path / "q.jsonl", records)
    flags = ("--choices", ",".join(CHOICES), "--choice-scoring", "loglikelihood", "--choice-logprobs")
    r = run(stories, q, tmp_path / "off.jsonl", *flags, "--prefix-cache", "off", "--report", tmp_path / "rep.json")
    assert r.returncode == 0, r.stderr
    cache = json.loads((tmp_path / "rep.json").read_text())["prefix_cache"]
    assert cache["prompt_tokens_computed"] <= cache["prompt_tokens"] + len(CHOICES) * len(records)
    assert run(stories, q, tmp_path / "on.jsonl", *flags).returncode == 0
    assert rows_of(tmp_path / "off.jsonl") == rows_of(tmp_path / "on.jsonl")


def test_choices_auto_in_csv_and_a_resumed_job_writes_the_same_file(tmp_path, stories):
    records = story_records(12, auto=True)
    q = write_jsonl(tmp_path / "q.jsonl", records)
    out = tmp_path / "a.csv"
    flags = ("--choices", "auto", "--choice-scoring", "loglikelihood")
    r = run(stories, q, out, *flags)
    assert r.returncode == 0, r.stderr
    whole = out.read_bytes()
    with out.open(newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["questionID", "answer", "answer_norm", "error"]
    check_picks({row["questionID"]: row for row in table}, expected(stories, records, None))
    # stopped halfway: the journal holds the first answers only, the answers file is not written yet
    journal = Path(f"{out}.journal.jsonl")
    lines = journal.read_text().splitlines(keepends=True)
    assert len(lines) == JOURNAL_HEAD + len(records)
    journal.write_text("".join(lines[:JOURNAL_HEAD + len(records) // 2]))
    out.unlink()
    r = run(stories, q, out, *flags, "--report", tmp_path / "rep.json")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == whole
    assert json.loads((tmp_path / "rep.json").read_text())["questions"]["from_journal"] == len(records) // 2


def test_the_journal_is_not_reused_across_scorings(tmp_path, stories):
    q = write_jsonl(tmp_path / "q.jsonl", story_records(2))
    out = tmp_path / "a.jsonl"
    assert run(stories, q, out, "--choices", "cat,dog").returncode == 0
    r = run(stories, q, out, "--choices", "cat,dog", "--choice-scoring", "loglikelihood")
    assert r.returncode != 0 and "answer.choice_scoring" in r.stderr


@pytest.mark.timeout(60)
def test_loglikelihood_without_choices_names_the_key(tmp_path, stories):
    q = write_jsonl(tmp_path / "q.jsonl", story_records(1))
    r = run(stories, q, tmp_path / "a.jsonl", "--choice-scoring", "loglikelihood", timeout=50)
    assert r.returncode == 2
    assert "answer.choice_scoring" in r.stderr and "answer.choices" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_flash_attention_is_off_for_scoring_unless_the_job_sets_it():
    from ggbatch.runner.config.schema import build_config

    base = {"model": "m.gguf", "input": "q.jsonl", "output": "a.jsonl", "answer.choices": "A,B"}
    scored = {**base, "answer.choice_scoring": "loglikelihood"}
    assert build_config([("job", base)]).flash_attn is None  # auto: on
    assert build_config([("job", scored)]).flash_attn is False
    assert build_config([("job", {**scored, "flash_attn": True})]).flash_attn is True


@pytest.mark.parametrize("extra, named", [({"answer.token_logprobs": 2}, "answer.token_logprobs: 2"),
                                           ({"sampling.n": 2, "sampling.temperature": 0.5}, "not sampled")])
def test_what_a_scored_choice_cannot_have_is_refused_by_name(extra, named):
    """No token is generated for a choice scored by log-likelihood: token log-probabilities or
    samples are refused, not silently dropped."""
    from ggbatch.runner.config.schema import build_config
    from ggbatch.runner.errors import ConfigError

    job = {"model": "m.gguf", "input": "q.jsonl", "output": "a.jsonl", "answer.choices": "A,B",
           "answer.choice_scoring": "loglikelihood", **extra}
    with pytest.raises(ConfigError, match=named):
        build_config([("job", job)])


def test_scoring_under_a_long_shared_prefix_keeps_a_kv_stream_per_sequence(tmp_path, stories):
    """Without the prefix cache a long shared prefix would get one unified KV pool, where scores
    move with the rest of the batch: a scoring job keeps a stream per sequence, and its sums are
    those of a job with the prefix cache."""
    system = "Once upon a time " + " ".join(random.Random(9).choice(STORY_WORDS) for _ in range(150))
    q = write_jsonl(tmp_path / "q.jsonl", story_records(6))
    sums = {}
    for cache in ("off", "auto"):
        out = tmp_path / f"a-{cache}.jsonl"
        r = run(stories, q, out, "--choices", ",".join(CHOICES), "--choice-scoring", "loglikelihood",
                "--choice-logprobs", "--system", system, "--prefix-cache", cache, "--slots", 4,
                "--report", tmp_path / f"rep-{cache}.json")
        assert r.returncode == 0, r.stderr
        rep = json.loads((tmp_path / f"rep-{cache}.json").read_text())
        assert rep["layout"]["kv"] == "per-sequence"
        assert rep["layout"]["shared_prefix_tokens"] > 150
        sums[cache] = {qid: row["choice_logprobs"] for qid, row in rows_of(out).items()}
    worst = max(abs(sums["off"][qid][c] - v) for qid, want in sums["auto"].items() for c, v in want.items())
    assert worst < TOLERANCE


def test_a_picked_choice_keeps_its_spaces_in_every_format(tmp_path, stories):
    """answer and answer_norm are both one of the choices as the job spelt them: spaces around a
    choice are part of its continuation, and of its score."""
    choices = [" barked", "\nran away", "sat "]
    records = [{**rec, "choices": choices} for rec in story_records(3)]
    q = write_jsonl(tmp_path / "q.jsonl", records)
    flags = ("--choices", "auto", "--choice-scoring", "loglikelihood")
    out = tmp_path / "a.jsonl"
    assert run(stories, q, out, *flags).returncode == 0
    for row in rows_of(out).values():
        assert row["answer"] in choices and row["answer_norm"] in choices
    csv_out = tmp_path / "b.csv"
    assert run(stories, q, csv_out, *flags).returncode == 0
    with csv_out.open(newline="") as f:
        assert all(row["answer"] in choices for row in csv.DictReader(f))


def test_equal_choice_texts_are_scored_alike_and_the_first_wins(tmp_path, stories):
    """Equal texts in one record (MMLU's ["12", "-4", "4", "12"]) answer the run, not refuse it: in
    every format and both scorings, the equal ones have one score and a tie goes to the first."""
    texts = [["happy", "tree", "happy"], ["the girl", "happy", "the girl", "tree"], ["A", "B", "A"]]
    records = [{**rec, "choices": texts[i % 3]} for i, rec in enumerate(story_records(6))]
    q = write_jsonl(tmp_path / "q.jsonl", records)
    sums = expected(stories, records, None)
    for scoring, suffix in (("loglikelihood", "jsonl"), ("loglikelihood", "csv"), ("first_token", "json")):
        out = tmp_path / f"a-{scoring}.{suffix}"
        r = run(stories, q, out, "--choices", "auto", "--choice-scoring", scoring, "--choice-logprobs")
        assert r.returncode == 0, r.stderr
        if suffix == "csv":
            with out.open(newline="") as f:
                rows = {row["questionID"]: {**row, "choice_logprobs": json.loads(row["choice_logprobs"] or "null")}
                        for row in csv.DictReader(f)}
        else:
            text = out.read_text()
            rows = {row["questionID"]: row for row in (json.loads(text) if suffix == "json"
                                                          else map(json.loads, text.splitlines()))}
        for rec in records:
            row = rows[rec["questionID"]]
            assert row["answer"] in rec["choices"]
            if scoring == "loglikelihood":
                check_picks({rec["questionID"]: row}, {rec["questionID"]: sums[rec["questionID"]]})
                assert set(row["choice_logprobs"]) == set(rec["choices"])
    empty = write_jsonl(tmp_path / "e.jsonl", [*records[:2], {**records[2], "choices": ["A", ""]}])
    r = run(stories, empty, tmp_path / "e.jsonl.out.jsonl", "--choices", "auto", timeout=60)
    assert r.returncode == 2 and f"record '{records[2]['questionID']}'" in r.stderr


def scored(model, tmp_path, name: str, records: list[dict], *choices: str) -> tuple[dict[str, dict], str]:
    """Each record's row of a log-likelihood run with choice_logprobs, and the run's stderr."""
    write_jsonl(tmp_path / f"{name}.jsonl", records)
    r = run(model, tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl", "--choices", *(choices or ["auto"]),
            "--choice-scoring", "loglikelihood", "--choice-logprobs")
    assert r.returncode == 0, r.stderr
    rows = map(json.loads, (tmp_path / f"{name}.out.jsonl").read_text().splitlines())
    return {row["questionID"]: row for row in rows}, r.stderr


def test_labelled_choices_a_prompt_does_not_list_are_scored_by_their_texts_and_answered_by_label(tmp_path,
                                                                                               demo_model):
    """MMLU lists its choices in the question and lm-eval scores the letters; ARC does not, and
    lm-eval scores the texts. A record's labelled choices its prompt does not list beside their
    labels are scored by their texts (acc_norm divides by the text's length) and answered by
    label; listed ones are scored by their labels. The first is said once."""
    texts = ["girl", "dog house", "cat", "boy", "girl"]  # equal texts score alike; the first wins a tie
    labels = ["A", "B", "C", "D", "E"]
    question = "Once upon a time there was a little"
    arc = [{"questionID": f"arc{i}", "question": f"{question} {word}", "choices": {"text": texts, "label": labels}}
           for i, word in enumerate(["", "big", "happy"])]
    rows, said = scored(demo_model, tmp_path, "arc", arc)
    by_text, _ = scored(demo_model, tmp_path, "texts", [{**rec, "choices": texts} for rec in arc])
    for rec in arc:
        row, plain = rows[rec["questionID"]], by_text[rec["questionID"]]
        assert row["choice_logprobs"] == {label: plain["choice_logprobs"][text] for label, text in zip(labels, texts)}
        assert row["answer"] == labels[texts.index(plain["answer"])]
        assert row["answer_norm"] == labels[texts.index(plain["answer_norm"])]
    assert [line for line in said.splitlines() if "scored" in line] == [
        f"ggbatch: {tmp_path / 'arc.jsonl'}:1: record 'arc0': its prompt does not list its choices beside their "
        "labels, so their texts are scored and their labels answered (as lm-eval's ARC; said once)"]

    listing = "\n\n" + "\n".join(f"{label}. {text}" for label, text in zip(labels, texts))
    mmlu = [{**rec, "question": rec["question"] + listing} for rec in arc]
    rows, said = scored(demo_model, tmp_path, "mmlu", mmlu)
    by_label, _ = scored(demo_model, tmp_path, "letters", [{k: v for k, v in rec.items() if k != "choices"}
                                                            for rec in mmlu], ",".join(labels))
    assert "scored" not in said
    for rec in mmlu:
        assert rows[rec["questionID"]]["choice_logprobs"] == by_label[rec["questionID"]]["choice_logprobs"]


def test_a_labelled_choice_of_empty_text_and_auto_choices_of_openai_lines_are_refused(tmp_path, demo_model):
    """A labelled choice whose text is empty, now scored, killed every worker it reached
    (ZeroDivisionError five times, then each record failed); OpenAI Batch lines, which carry no
    choices, were answered with free text under --choices auto, exit 0."""
    for i, choices in enumerate(({"text": ["a", ""], "label": ["A", "B"]}, {"A": "c", "B": ""})):
        rows = [{"questionID": "q0", "question": "x?", "choices": {"A": "a", "B": "b"}},
                {"questionID": "q1", "question": "y?", "choices": choices}]
        write_jsonl(tmp_path / f"e{i}.jsonl", rows)
        r = run(demo_model, tmp_path / f"e{i}.jsonl", tmp_path / f"e{i}.out.jsonl", "--choices", "auto",
                "--choice-scoring", "loglikelihood", timeout=60)
        assert r.returncode == 2 and "died" not in r.stderr, r.stderr
        assert f"e{i}.jsonl:2: record 'q1': choices must be non-empty strings" in r.stderr.splitlines()[-1]
    line = {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Which says meow? A. a dog B. a cat"}], "max_tokens": 8}}
    write_jsonl(tmp_path / "b.jsonl", [line])
    r = run(demo_model, tmp_path / "b.jsonl", tmp_path / "b.out.jsonl", "--choices", "auto", timeout=60)
    assert r.returncode == 2 and not (tmp_path / "b.out.jsonl").exists(), r.stderr
    assert r.stderr.splitlines()[-1] == (f"ggbatch: error: answer.choices: auto takes each record's own 'choices', "
                                         f"and {tmp_path / 'b.jsonl'} holds OpenAI Batch requests, whose lines carry "
                                         "none: list the choices (--choices A,B,C,D)")


def test_a_scored_jobs_context_holds_its_prompts_and_choices_and_no_room_for_max_tokens(tmp_path, stories):
    """A scored question generates nothing: each sequence's context is its prompt and its longest
    choice, whatever max_tokens says (its KV cache is allocated and cleared as a worker starts)."""
    q = write_jsonl(tmp_path / "q.jsonl", story_records(3))
    r = run(stories, q, tmp_path / "a.jsonl", "--choices", ",".join(CHOICES), "--choice-scoring", "loglikelihood",
            "--max-tokens", 1000, "--report", tmp_path / "rep.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "rep.json").read_text())
    assert report["layout"]["n_ctx_per_sequence"] < 200, report["layout"]  # prompts of 20-40 words and a choice
