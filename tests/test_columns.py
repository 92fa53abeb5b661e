"""The compact per-question columns of a streamed file (runner/files/compact.py) and the answer tally."""

import json

from ggbatch.runner.files import compact as columns
from ggbatch.runner.files.compact import HashIndex, IdColumn, IdSet, text_key
from ggbatch.runner.files.formats.rows import OutputSpec, Row
from ggbatch.runner.files.outputs import render
from ggbatch.runner.watch.tally import AnswerTally, RecordCounts
from ggbatch.workers.protocol import Answer, FinishReason, Sample, TokenLogprob


def test_ids_come_back_in_order_whatever_their_characters():
    ids = IdColumn()
    names = ["q1", "", "日本-7", "007", "a\u2028b", "x" * 300]
    assert [ids.append(n) for n in names] == list(range(len(names)))
    assert list(ids) == names and [ids[i] for i in range(len(names))] == names and len(ids) == len(names)
    ids.same_as(3, 0)  # "007" takes the answer of "q1"
    assert list(ids.answered_as())[2:4] == [("日本-7", "日本-7"), ("007", "q1")]
    ids.extend(["more", "日本", ""])
    assert list(ids)[-4:] == ["x" * 300, "more", "日本", ""] and ids[len(names) + 1] == "日本"


def test_a_hash_index_finds_every_key_before_and_after_merging(monkeypatch):
    monkeypatch.setattr(columns, "MERGE_AT", 7)  # merge often: the arrays and the dict both answer
    index = HashIndex()
    keys = [text_key(f"q{i}") for i in range(100)]
    for i, k in enumerate(keys):
        index.add(k, i)
    assert [index.get(k) for k in keys] == list(range(100))
    assert index.get(text_key("absent")) is None
    index.add(keys[3], -1)  # a key added again: the newer value
    assert index.get(keys[3]) == -1
    assert len(index) == 100 and index.get(keys[3]) == -1  # after the merge too
    index.add(keys[5], 55)  # in the dict, not merged yet
    absent = text_key("absent")
    assert index.get_many([keys[0], absent, keys[3], keys[5], keys[99]]) == [0, None, -1, 55, 99]
    index.add_many([absent], [7])
    assert index.get_many([absent]) == [7]


def test_a_hash_index_agrees_with_a_dict_through_many_merges(monkeypatch):
    import random

    monkeypatch.setattr(columns, "MERGE_AT", 50)
    rng = random.Random(7)
    pool = [0, (1 << 64) - 1, 1, 1 << 63] + [rng.getrandbits(64) for _ in range(400)]
    index, truth = HashIndex(), {}
    for step in range(3000):  # keys added, and added again with new values, alone and in batches
        if step % 3:
            k = rng.choice(pool)
            index.add(k, step)
            truth[k] = step
        else:  # small batches through the dict, large ones (a key twice in one) straight to the arrays
            ks = [rng.choice(pool) for _ in range(5 if step % 2 else 80)]
            vs = [step * 100 + i for i in range(len(ks))]
            index.add_many(ks, vs)
            truth.update(zip(ks, vs))
    wanted = pool + [rng.getrandbits(64) for _ in range(50)]
    assert index.get_many(wanted) == [truth.get(k) for k in wanted]
    assert [index.get(k) for k in wanted] == [truth.get(k) for k in wanted] and len(index) == len(truth)


def test_an_id_set_holds_exactly_the_ids_added():
    ids = IdColumn()
    ids.extend(["a", "b", "日本", "007", "7"])
    some = IdSet(ids)
    some.add("日本", 2)
    some.add("007", 3)
    assert ["日本" in some, "007" in some, "7" in some, "a" in some, "zz" in some, 7 in some] == \
        [True, True, False, False, False, False]
    assert len(some) == 2


def test_json_rows_are_written_exactly_as_json_dumps_writes_the_array():
    answers = [Answer(qid=f"q{i}", text=f"text {i}\nmore", finish_reason=FinishReason.STOP, prompt_tokens=3,
                      completion_tokens=1) for i in range(3)]
    rows = [Row(a.qid, a) for a in answers] + [Row("q9", None, "not answered")]
    fields = [{"questionID": "q0", "answer": "text 0\nmore"}, {"questionID": "q1", "answer": "text 1\nmore"},
              {"questionID": "q2", "answer": "text 2\nmore"}, {"questionID": "q9", "answer": None,
                                                               "error": "not answered"}]
    assert render(rows, OutputSpec("json")) == json.dumps(fields, ensure_ascii=False, indent=1) + "\n"
    assert render([], OutputSpec("json")) == "[]\n"


def test_json_rows_put_each_item_of_a_fields_list_on_a_line_of_its_own():
    # A token's log-probability entry on one line, not a line per byte of its text as indent
    # writes it; n samples' answers each on a line, as indent writes them, and each sample's
    # entries a line each.
    entry = TokenLogprob(9, "é".encode(), -0.25, ((9, "é".encode(), -0.25), (4, b" x", -1.5)))
    samples = (Sample("a\nb", FinishReason.STOP, 2, (entry,)), Sample("c", FinishReason.LENGTH, 1, (entry,)))
    rows = [Row("q0", Answer(qid="q0", text="éé", finish_reason=FinishReason.STOP, prompt_tokens=3, completion_tokens=1,
                             token_logprobs=(entry, entry))),
            Row("q1", Answer(qid="q1", text="a\nb", finish_reason=FinishReason.STOP, prompt_tokens=3,
                             completion_tokens=1, samples=samples))]
    text = render(rows, OutputSpec("json"))
    got = json.loads(text)
    one = '{"token": "é", "logprob": -0.25, "bytes": [195, 169], "top_logprobs": [{"token": "é", "logprob": -0.25, ' \
          '"bytes": [195, 169]}, {"token": " x", "logprob": -1.5, "bytes": [32, 120]}]}'
    assert got[0]["token_logprobs"] == [json.loads(one)] * 2 and got[1]["answer"] == ["a\nb", "c"]
    assert text.split("\n")[:7] == ['[', ' {', '  "questionID": "q0",', '  "answer": "éé",', '  "token_logprobs": [',
                                     f'   {one},', f'   {one}']
    assert '  "answer": [\n   "a\\nb",\n   "c"\n  ],' in text
    assert f'  "token_logprobs": [\n   [\n    {one}\n   ],\n   [\n    {one}\n   ]\n  ]\n }}\n]\n' in text


def test_the_tally_counts_what_the_report_says():
    tally = AnswerTally()
    tally.add([Answer(qid="a", text="x", finish_reason=FinishReason.STOP, prompt_tokens=10, completion_tokens=4,
                      worker_id=0, ttft_s=0.5, latency_s=1.0),
               Answer(qid="b", text="", finish_reason=FinishReason.ERROR, prompt_tokens=5, completion_tokens=0,
                      worker_id=1, ttft_s=0.0, latency_s=0.3, error="boom"),
               Answer(qid="c", text="y", finish_reason=FinishReason.LENGTH, prompt_tokens=7, completion_tokens=2,
                      worker_id=1, ttft_s=0.2, latency_s=2.0)])
    assert tally.made == 3
    assert (tally.prompt_tokens, tally.generated_tokens) == (22, 6)
    assert list(tally.latency_s) == [1.0, 2.0] and list(tally.ttft_s) == [0.5, 0.2]
    assert tally.of_worker(1) == {"questions": 2, "generated_tokens": 2}


def test_finish_reasons_count_every_sample_of_a_question_with_several():
    """A line whose samples ended `stop` and `length` counted as `stop` only (its first sample)."""
    samples = (Sample("a", FinishReason.STOP, 2), Sample("bb", FinishReason.LENGTH, 8))
    counts = RecordCounts()
    counts.count("q0", Answer(qid="q0", text="a", finish_reason=FinishReason.STOP, prompt_tokens=3,
                              completion_tokens=10, worker_id=0, ttft_s=0.1, latency_s=0.5, samples=samples))
    counts.count("q1", Answer(qid="q1", text="c", finish_reason=FinishReason.LENGTH, prompt_tokens=3,
                              completion_tokens=8, worker_id=0, ttft_s=0.1, latency_s=0.5))
    assert counts.finish_reasons == {"stop": 1, "length": 2} and counts.answered == 2


def _add_from_two_threads(index: HashIndex, n: int) -> None:
    """Odd keys one at a time from one thread while another adds the even keys 3,000 at a time,
    as the pool's thread journals new answers while the feed thread reuses a window's."""
    import threading

    def odd() -> None:
        for i in range(1, n, 2):
            index.add(i, i)

    def even() -> None:
        evens = list(range(0, n, 2))
        for at in range(0, len(evens), 3000):
            chunk = evens[at:at + 3000]
            index.add_many(chunk, chunk)

    threads = [threading.Thread(target=odd), threading.Thread(target=even)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)


def test_a_hash_index_written_from_two_threads_keeps_every_key(monkeypatch):
    import sys

    monkeypatch.setattr(columns, "MERGE_AT", 1000)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: the race shows at once
    try:
        for _ in range(3):
            index, n = HashIndex(), 200_000
            _add_from_two_threads(index, n)
            assert len(index) == n
            assert index.get_many(list(range(n))) == list(range(n))
    finally:
        sys.setswitchinterval(interval)
