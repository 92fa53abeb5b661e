"""Token log-probabilities (answer.token_logprobs, an OpenAI line's logprobs): the numbers are the
model's own log-softmax, as a plain llama-cpp-python Llama(logits_all=True) computes it over the
same tokens; they go through the journal unchanged; the output shapes are the ones the openai
package's types read."""

from __future__ import annotations

import json
from array import array

import numpy as np
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from ggbatch.runner.files.formats.openai_output import batch_line
from ggbatch.runner.files.formats.openai_request import parse_request
from ggbatch.runner.files.formats.rows import OutputSpec, Row
from ggbatch.runner.files.formats.token_logprobs import completion_logprobs, from_journal, text_offsets, to_journal
from ggbatch.workers.engine.logprobs import answer_tokens, block_logprobs, row_logprobs
from ggbatch.workers.protocol import (
    Answer,
    EngineConfig,
    FinishReason,
    GenerationParams,
    Question,
    SamplingParams,
    TokenLogprob,
)
from helpers import answers_of, ggbatch, write_jsonl

TOL = 1e-3


def reference_log_softmax(model: str, tokens: list[int]) -> np.ndarray:
    """log-softmax of every position's logits, by llama-cpp-python's own Llama(logits_all=True)."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=len(tokens) + 8, logits_all=True, verbose=False)
    try:
        llm.eval(tokens)
        scores = np.array(llm.scores[:len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    top = scores.max(axis=1, keepdims=True)
    return scores - top - np.log(np.exp(scores - top).sum(axis=1, keepdims=True))


# -- pure -----------------------------------------------------------------------------------------


def test_row_logprobs_match_a_float64_reference_and_order_ties_by_id():
    rows = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.25, 4.0, 4.0]], dtype=np.float32)
    ref = rows.astype(np.float64) - np.log(np.exp(rows.astype(np.float64)).sum(axis=1, keepdims=True))
    scratch = np.empty(4, np.float32)
    (pick0, top0), (pick1, top1) = row_logprobs(rows[0], 0, 3, scratch), row_logprobs(rows[1], 3, 3, scratch)
    assert (pick0, pick1) == pytest.approx((ref[0, 0], ref[1, 3]), abs=1e-6)
    assert [t for t, _ in top0] == [1, 2, 0] and [t for t, _ in top1] == [2, 3, 0]
    assert top0[0][1] == pytest.approx(ref[0, 1], abs=1e-6)
    assert row_logprobs(rows[0], 1, 0, scratch)[1] == []
    # the k most likely, however far below the highest they are
    spread = np.array([0.0, -30.0, -60.0, 5.0], dtype=np.float32)
    assert [t for t, _ in row_logprobs(spread, 0, 4, scratch)[1]] == [3, 0, 1, 2]


def test_row_logprobs_of_a_flat_row_take_the_k_highest_ties_by_id():
    # A random or very unsure model puts most of a large vocabulary within a few nats of the top:
    # the top k then come from a partition of the row, still in order, ties to the lower id.
    rng = np.random.default_rng(0)
    row = (rng.normal(size=20_000) * 0.1).astype(np.float32)
    row[[7, 11, 19_000]] = row.max() + 1.0  # a three-way tie at the top
    ref = sorted(range(len(row)), key=lambda i: (-row[i], i))[:5]
    _, top = row_logprobs(row, 7, 5, np.empty_like(row))
    assert [t for t, _ in top] == ref and ref[:3] == [7, 11, 19_000]
    flat = np.zeros(5_000, np.float32)
    assert [t for t, _ in row_logprobs(flat, 0, 3, np.empty_like(flat))[1]] == [0, 1, 2]

def test_a_rows_top_k_come_from_its_groups_not_a_partition(monkeypatch):
    # A random-weight model's rows (the benchmarks'): a 151,936-token vocabulary within a nat of
    # the top, where a partition of each row cost ten passes over it. The top k come from the
    # groups whose maxima reach the k-th highest group maximum: those of the whole row, ties to
    # the lower id, in every shape; a partition only where many are equal at the top or the row is
    # shorter than k groups.
    from ggbatch.workers.engine import logprobs

    partitioned = []
    whole_row = logprobs._partition_ids
    monkeypatch.setattr(logprobs, "_partition_ids", lambda row, k: partitioned.append(len(row)) or whole_row(row, k))
    rng = np.random.default_rng(2)
    flat = (rng.normal(size=151_936) * 0.16).astype(np.float32)
    peaked = (rng.normal(size=20_011) * 3).astype(np.float32)  # 11 past the last whole group
    peaked[20_005] = peaked.max() + 0.5  # the highest among those 11
    steep = (rng.normal(size=20_000) * 1e-3 - 3).astype(np.float32)  # two far above a noisy plateau
    steep[[4, 8]] = [0.0, -0.5]
    tiny = np.float32([0.5, 3.0, 1.0, 3.0, -1.0])  # fewer ids than k groups hold
    ties = np.zeros(20_000, np.float32)  # every logit the highest
    for row, expect_partition in ((flat, False), (peaked, False), (steep, False), (tiny, True), (ties, True)):
        for k in (5, 20):  # 20: OpenAI's most top_logprobs, 20 groups of 64
            partitioned.clear()
            k = min(k, len(row))
            ref = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
            highest, (ids,) = logprobs._top_ids(row[None, :], k)
            assert ids == ref and highest[0] == row.max()
            assert bool(partitioned) == expect_partition
    assert ref == list(range(20))  # the ties: the lowest ids


def test_a_block_of_rows_gives_each_rows_own_numbers():
    # block_logprobs works on all rows at once, in place where asked: peaked rows, a flat row
    # (its top k from a partition) and a tie at the top, bit for bit what each row gives alone.
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(5, 30_000)).astype(np.float32) * 2
    rows[:3, rng.integers(0, 30_000, 20)] += 12.0
    rows[3] = 0.0
    rows[4, [5, 9, 77]] = rows[4].max() + 1.0
    tokens = [int(t) for t in rng.integers(0, 30_000, 5)]
    for k in (0, 5):
        alone = [row_logprobs(rows[i], tokens[i], k, np.empty(30_000, np.float32)) for i in range(5)]
        block = rows.copy()
        assert block_logprobs(rows, tokens, k, np.empty_like(rows)) == alone
        assert block_logprobs(block, tokens, k, block) == alone
    assert [t for t, _ in alone[4][1][:3]] == [5, 9, 77]


def test_answer_tokens_drops_the_tokens_inside_a_stop_string():
    pieces = [b"The", b" end", b"\n\n", b"Q", b":"]
    assert answer_tokens(pieces, len("The end")) == 2
    assert answer_tokens(pieces, len("The end\n")) == 3  # the stop string starts inside a token
    assert answer_tokens(pieces, 100) == 5
    # a character in byte tokens starts where its first byte does: all of them are the answer's
    assert answer_tokens([b"\xe6", b"\x97", b"\xa5", b"x"], 1) == 3  # U+65E5, then the stop
    assert answer_tokens([b"ab", b"\xc3", b"\xa9", b"!"], 3) == 3


def entries() -> tuple[TokenLogprob, ...]:
    return (TokenLogprob(5, b" caf", -0.25, ((5, b" caf", -0.25), (9, b"\xc3", -1.5))),
            TokenLogprob(9, b"\xc3", -3.125, ((7, b"\xa9", -0.5), (9, b"\xc3", -3.125))),
            TokenLogprob(7, b"\xa9", -0.0001, ()))


def test_the_journal_form_reads_back_the_same_entries():
    back = from_journal(json.loads(json.dumps(to_journal(entries()))))
    assert back == entries()


def answered(text: str) -> Answer:
    return Answer(qid="q", text=text, finish_reason=FinishReason.STOP, prompt_tokens=4, completion_tokens=3,
                  token_logprobs=entries())


def test_openai_chat_logprobs_parse_as_the_openai_types_read_them():
    line = batch_line(Row("q", answered(" café")), OutputSpec("openai", model_name="m"))
    body = ChatCompletion.model_validate(line["response"]["body"])
    content = body.choices[0].logprobs.content
    assert [c.logprob for c in content] == [-0.25, -3.125, -0.0001]
    assert content[0].token == " caf" and content[0].bytes == list(b" caf")
    assert content[1].bytes == [0xc3] and content[1].top_logprobs[0].bytes == [0xa9]
    assert [t.logprob for t in content[0].top_logprobs] == [-0.25, -1.5]


def test_openai_completion_logprobs_parse_as_the_openai_types_read_them():
    line = batch_line(Row("q", answered(" café")), OutputSpec("openai", model_name="m", completions={"q"}))
    body = Completion.model_validate(line["response"]["body"])
    lp = body.choices[0].logprobs
    assert lp.tokens == [" caf", "\ufffd", "\ufffd"] and lp.token_logprobs == [-0.25, -3.125, -0.0001]
    assert lp.text_offset == [0, 4, 4]  # both bytes of é start at é, the completion's 5th character
    # the top alternatives, and the picked token too where it is not among them
    assert lp.top_logprobs[0] == {" caf": -0.25, "\ufffd": -1.5} and lp.top_logprobs[2] == {"\ufffd": -0.0001}


def test_text_offsets_count_characters_of_the_decoded_completion():
    # 旗 (E6 97 97) split in three, a broken run (one U+FFFD for E6 97), then 旗 again, a stray byte
    pieces = [b"a", b"\xe6", b"\x97", b"\x97", b"\xe6\x97", b"x", b"\xe6", b"\x97\x97", b"\x97", b"", b"b"]
    text = b"".join(pieces).decode("utf-8", errors="replace")
    assert text == "a\u65d7\ufffdx\u65d7\ufffdb"
    assert text_offsets(pieces) == [0, 1, 1, 1, 2, 3, 4, 4, 5, 6, 6]
    # an empty piece inside a character starts at it, as the character's other pieces do (it was
    # past it: [0, 1, 0], offsets going back), and inside a broken run at its U+FFFD
    assert text_offsets([b"\xe6", b"", b"\x97\xa5"]) == [0, 0, 0]
    assert text_offsets([b"\xe6\x97", b"", b"x"]) == [0, 0, 1]


def test_completion_top_logprobs_keep_the_likelier_of_equal_texts_and_the_picked_tokens_own():
    # two byte tokens both read U+FFFD: the likelier's value stays; a picked token below the top
    # whose text is one of theirs keeps its own value
    likelier = TokenLogprob(5, b" caf", -0.25, ((5, b" caf", -0.25), (9, b"\xc3", -1.5), (7, b"\xa9", -2.0)))
    below = TokenLogprob(8, b"\xa0", -6.0, ((7, b"\xa9", -0.5), (9, b"\xc3", -1.0)))
    tops = completion_logprobs([likelier, below])["top_logprobs"]
    assert tops == [{" caf": -0.25, "\ufffd": -1.5}, {"\ufffd": -6.0}]


def test_openai_request_logprobs_fields():
    chat = {"custom_id": "q", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3}}
    assert parse_request(chat).settings.token_logprobs == 3
    chat["body"]["top_logprobs"] = 21
    assert "body.top_logprobs: must be from 0 to 20" in parse_request(chat).error
    chat["body"]["logprobs"] = False
    chat["body"]["top_logprobs"] = 2
    assert "body.top_logprobs: needs body.logprobs true" in parse_request(chat).error
    completion = {"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "a", "logprobs": 5}}
    assert parse_request(completion).settings.token_logprobs == 5
    completion["body"]["logprobs"] = 6
    assert "body.logprobs: must be from 0 to 5" in parse_request(completion).error


# -- on a model -------------------------------------------------------------------------------------


def engine_answers(model: str, questions: list[Question], slots: int, threads: int = 1,
                   **gen) -> dict[str, Answer]:
    from ggbatch.workers.llama.engine import LlamaEngine

    config = EngineConfig(model_path=model, n_threads=threads, slots=slots, n_ctx_seq=96, n_batch=128,
                          generation=GenerationParams(**gen))
    engine = LlamaEngine(config, worker_id=0)
    try:
        return answers_of(engine, questions)
    finally:
        engine.close()


@pytest.mark.model
@pytest.mark.timeout(180)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("spread", [False, True])
def test_engine_logprobs_equal_llama_cpp_pythons_log_softmax(demo_model, temperature, spread, monkeypatch):
    """Several sequences in one batch, greedy and sampled, their rows in one thread or cut into
    runs over 3 threads of blocks of 2: each token's log-probability and its top 5 are those of a
    plain Llama(logits_all=True) evaluating the same tokens, one sequence alone."""
    from ggbatch.workers.llama import sampling as host

    if spread:  # the demo model's rows are small: make 5 of them worth 3 threads
        monkeypatch.setattr(host.Sampling, "floats_per_thread", 1)
        monkeypatch.setattr(host.Sampling, "host_threads", 3)
        monkeypatch.setattr(host, "LOGPROB_BLOCK_ROWS", 2)
    prompts = [array("i", [1, 20 + i, 40 + 3 * i, 7, 90 + i]) for i in range(5)]
    questions = [Question(f"q{i}", p, 11 + i) for i, p in enumerate(prompts)]
    got = engine_answers(demo_model, questions, slots=5, threads=2, max_tokens=12, ignore_eos=True, token_logprobs=5,
                         sampling=SamplingParams(temperature=temperature, top_k=20))
    for q in questions:
        entries = got[q.qid].token_logprobs
        assert entries is not None and len(entries) == 12
        tokens = list(q.tokens) + [e.token for e in entries]
        ref = reference_log_softmax(demo_model, tokens)
        n = len(q.tokens)
        for j, e in enumerate(entries):
            row = ref[n - 1 + j]
            assert abs(e.logprob - row[e.token]) < TOL
            best = np.argsort(-row, kind="stable")[:5]
            assert [t for t, _, _ in e.top] == [int(t) for t in best] or \
                np.allclose([lp for _, _, lp in e.top], row[best], atol=TOL)  # a near-tie may swap two
            assert all(abs(lp - row[t]) < TOL for t, _, lp in e.top)


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_question_that_does_not_ask_gets_none(demo_model):
    qs = [Question("plain", array("i", [1, 5, 6]), 0),
          Question("asks", array("i", [1, 5, 7]), 0, GenerationParams(max_tokens=4, ignore_eos=True,
                                                                     token_logprobs=0))]
    got = engine_answers(demo_model, qs, slots=2, max_tokens=4, ignore_eos=True)
    assert got["plain"].token_logprobs is None
    asks = got["asks"].token_logprobs
    assert asks is not None and len(asks) == 4 and all(e.top == () for e in asks)


# -- a whole run ------------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_run_writes_them_in_every_format_and_a_resume_keeps_them(demo_model, tmp_path, questions_file):
    questions = questions_file(3)
    out = tmp_path / "a.jsonl"
    args = ["run", "--model", demo_model, "--input", questions, "--max-tokens", "6", "--ignore-eos",
            "--token-logprobs", "2", "--progress", "off"]
    done = ggbatch(*args, "--output", out)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        items = row["token_logprobs"]
        assert 1 <= len(items) <= 6 and all(len(i["top_logprobs"]) == 2 for i in items)
        assert "".join(i["token"] for i in items).strip().startswith(row["answer"])
    again = ggbatch(*args, "--output", out, "--output-format", "jsonl")  # all from the journal
    assert again.returncode == 0, again.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    csv_out = tmp_path / "a.csv"
    assert ggbatch(*args, "--output", csv_out).returncode == 0
    import csv
    cells = list(csv.DictReader(csv_out.open(newline="")))
    assert [json.loads(c["token_logprobs"]) for c in cells] == [r["token_logprobs"] for r in rows]


def logprob_lines(max_tokens, chat_top):
    """OpenAI Batch lines: a chat line asking for its top alternatives, a completions line asking
    for 2, and a chat line asking for none."""
    return [{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": "Tell a story"}], "max_tokens": max_tokens,
                      "logprobs": True, "top_logprobs": chat_top}},
            {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": "Once upon a time", "max_tokens": max_tokens, "logprobs": 2}},
            {"custom_id": "none", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}}]


@pytest.mark.model
@pytest.mark.timeout(300)
def test_openai_batch_lines_get_both_shapes(demo_model, tmp_path):
    src = write_jsonl(tmp_path / "batch.jsonl", logprob_lines(max_tokens=5, chat_top=4))
    out = tmp_path / "out.jsonl"
    done = ggbatch("run", "--model", demo_model, "--input", src, "--output", out, "--ignore-eos",
                   "--progress", "off")
    assert done.returncode == 0, done.stderr
    got = {row["custom_id"]: row["response"]["body"] for row in map(json.loads, out.read_text().splitlines())}
    chat = ChatCompletion.model_validate(got["chat"]).choices[0]
    assert len(chat.logprobs.content) == 5 and all(len(c.top_logprobs) == 4 for c in chat.logprobs.content)
    cmpl = Completion.model_validate(got["cmpl"]).choices[0]
    assert "".join(cmpl.logprobs.tokens) == cmpl.text and len(cmpl.logprobs.token_logprobs) == 5
    assert all(1 <= len(top) <= 3 for top in cmpl.logprobs.top_logprobs)
    assert ChatCompletion.model_validate(got["none"]).choices[0].logprobs is None


@pytest.mark.model
@pytest.mark.timeout(300)
def test_an_openai_lines_own_logprobs_get_the_csv_column_as_json_has_them(demo_model, tmp_path):
    """The job asks for none: the lines' own `logprobs` plan CSV's token_logprobs column (as their
    own `n` plans samples), and its cells hold what JSON Lines output holds."""
    src = write_jsonl(tmp_path / "batch.jsonl", logprob_lines(max_tokens=4, chat_top=2))
    args = ["run", "--model", demo_model, "--input", src, "--ignore-eos", "--progress", "off"]
    assert ggbatch(*args, "--output", tmp_path / "a.jsonl", "--output-format", "jsonl").returncode == 0
    rows = {row["questionID"]: row for row in map(json.loads, (tmp_path / "a.jsonl").read_text().splitlines())}
    done = ggbatch(*args, "--output", tmp_path / "a.csv")
    assert done.returncode == 0, done.stderr
    import csv
    cells = {c["questionID"]: c for c in csv.DictReader((tmp_path / "a.csv").open(newline=""))}
    assert json.loads(cells["chat"]["token_logprobs"]) == rows["chat"]["token_logprobs"]
    assert json.loads(cells["cmpl"]["token_logprobs"]) == rows["cmpl"]["token_logprobs"]
    assert len(rows["chat"]["token_logprobs"]) == 4 and cells["none"]["token_logprobs"] == ""


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_first_token_choice_names_the_variant_its_score_is_read_from(demo_model, tmp_path, questions_file):
    """A choice is scored by its likeliest token variant (" B" or "B"): its token_logprobs entry is
    that variant, with the same log-probability as choice_logprobs gives the choice."""
    out = tmp_path / "c.jsonl"
    done = ggbatch("run", "--model", demo_model, "--input", questions_file(8), "--output", out,
                   "--choices", "A,B,C,D", "--choice-logprobs", "--token-logprobs", "3", "--progress", "off")
    assert done.returncode == 0, done.stderr
    for row in map(json.loads, out.read_text().splitlines()):
        (entry,) = row["token_logprobs"]
        assert entry["token"].strip() == row["answer"]
        assert entry["logprob"] == row["choice_logprobs"][row["answer"]]


@pytest.mark.model
@pytest.mark.timeout(120)
def test_a_choice_read_from_the_logits_has_the_number_of_its_tokens_entry(stories):
    """choice_logprobs and the token's log-probability entry come from one arithmetic: equal to
    the last digit, over questions enough to meet a row where two ways of summing would part."""
    import random

    from ggbatch.workers.llama.engine import LlamaEngine
    from ggbatch.workers.protocol import AnswerSpec
    rng = random.Random(1)
    gen = GenerationParams(max_tokens=4, answer=AnswerSpec(choices=("a", "b", "c"), logprobs=True), token_logprobs=0)
    engine = LlamaEngine(EngineConfig(model_path=stories, n_threads=1, slots=8, n_ctx_seq=64, n_batch=64,
                                      generation=gen, kv_unified=False, flash_attn=False), 0)
    questions = [Question(f"q{i}", array("i", [1] + [rng.randrange(3, 500) for _ in range(10)]), i) for i in range(64)]
    answers = answers_of(engine, questions)
    assert all(a.choice_logprobs[a.text] == a.token_logprobs[0].logprob for a in answers.values()), answers


def test_log_normalizers_a_few_rows_at_a_time_are_those_of_all_rows_at_once():
    """Made float64 a few rows at a time (a scored step's 1024 rows of a 150k vocabulary would be
    1.2 GB at once): each row's numbers are the same to the last bit."""
    from ggbatch.workers.engine.logprobs import NORMALIZER_ROWS, log_normalizers

    logits = (np.random.default_rng(0).standard_normal((NORMALIZER_ROWS * 3 + 5, 50_000)) * 6).astype(np.float32)
    rows = logits.astype(np.float64)
    top = rows.max(axis=1)
    whole = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
    got_top, got = log_normalizers(logits)
    assert (got_top == top).all() and (got == whole).all()
