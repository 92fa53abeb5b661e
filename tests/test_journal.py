import json
import resource
from array import array
from contextlib import contextmanager
from dataclasses import replace

import pytest

from ggbatch.runner.errors import ConfigError, JournalError
from ggbatch.runner.journal.entries import entry_of
from ggbatch.runner.journal.fingerprint import changed_setting, setting_change
from ggbatch.runner.journal.index import ENTRY, block_entries, parsed_entries
from ggbatch.runner.journal.journal import Journal
from ggbatch.workers.protocol import Answer, FinishReason, GenerationParams, Question, Sample, TokenLogprob
from helpers import answer as make_answer

FP = {"model.size_bytes": 10, "sampling.temperature": 0.0}


def answer(qid, text="t", error=None):
    return make_answer(qid, text, error, tokens=1)


def question(qid, *tokens):
    return Question(qid, array("i", tokens), 0)


def test_answers_survive_and_are_reused_only_for_unchanged_prompts(tmp_path):
    path = str(tmp_path / "a.json.journal.jsonl")
    asked = [question("q1", 1, 2), question("q2", 3), question("q3", 4)]
    j = Journal(path, FP)
    assert j.split(asked) == (asked, {})
    j.append([answer("q1", "one"), answer("q2", "two"), answer("q3", error="boom")])
    j.close()
    j = Journal(path, FP)
    edited, new = question("q2", 9), question("q4", 5)  # q2's question was edited: answer again
    todo, reused = j.split([asked[0], edited, asked[2], new])
    assert {qid: a.text for qid, a in reused.items()} == {"q1": "one"}
    assert [q.qid for q in todo] == ["q2", "q3", "q4"]  # failures are retried
    j.close()


@pytest.mark.parametrize("block", [64, 1 << 22])
def test_a_torn_last_line_is_dropped_and_the_file_stays_valid(tmp_path, monkeypatch, block):
    monkeypatch.setattr("ggbatch.runner.journal.index.BLOCK_BYTES", block)
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), FP)
    j.split([question("q1", 1)])
    j.append([answer("q1")])
    j.close()
    with open(path, "a") as f:
        f.write('{"qid": "q2", "prompt": "ab')  # killed mid-write
    j = Journal(str(path), FP)
    j.split([question("q1", 1), question("q3", 3)])
    j.append([answer("q3")])
    j.close()
    lines = path.read_text().splitlines()
    assert [line[:13] for line in lines[1:]] == ['{"qid": "q1",', '{"qid": "q3",']


def journaled(path, fingerprint, *answers):
    """A journal of these settings holding these answers (a journal of none blocks nothing)."""
    j = Journal(path, fingerprint, fresh=True)
    for a in answers or (answer("q1"),):
        j.split([question(a.qid, 1)])
        j.append([a])
    j.close()


def test_changed_fingerprint_names_the_setting(tmp_path):
    path = str(tmp_path / "j.jsonl")
    journaled(path, FP)
    with pytest.raises(ConfigError, match=r"'sampling.temperature' changed since the journaled run \(0.0 -> 0.7\)"):
        Journal(path, {**FP, "sampling.temperature": 0.7})
    journaled(path, {**FP, "sampling.temperature": 0.7})  # fresh starts over
    # a setting left out of the fingerprint at its default is named by that default
    with pytest.raises(ConfigError, match=r"'sampling.n' changed since the journaled run \(1 -> 4\)"):
        Journal(path, {**FP, "sampling.temperature": 0.7, "sampling.n": 4})


@pytest.mark.parametrize("held", [(), (answer("q1", error="boom"),)], ids=["header only", "only failures"])
def test_a_journal_without_an_answer_never_blocks_a_run(tmp_path, held):
    """A run refused for its input after the header was written (or whose every answer failed)
    left nothing to lose: a rerun with the setting fixed replaces its journal."""
    path = str(tmp_path / "j.jsonl")
    j = Journal(path, FP)
    for a in held:
        j.split([question(a.qid, 1)])
        j.append([a])
    j.close()
    j = Journal(path, {**FP, "sampling.temperature": 0.7})
    assert j.kept == 0
    j.close()
    with open(path) as f:
        assert json.loads(f.readline())["fingerprint"]["sampling.temperature"] == 0.7 and not f.read()


def test_a_file_that_is_not_a_journal_is_still_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text("my own notes\n")
    with pytest.raises(ConfigError, match="not a ggbatch journal"):
        Journal(str(path), FP)
    assert path.read_text() == "my own notes\n"


@pytest.mark.parametrize("left", [b"", b'{"ggbatch_jou', b'{"ggbatch_journal": 1, "fingerprint": {"model.si'])
def test_a_journal_killed_while_its_header_was_written_is_made_again(tmp_path, left):
    path = tmp_path / "j.jsonl"
    path.write_bytes(left)  # a kill -9 or a full disk between the file's making and its header's end
    j = Journal(str(path), FP)
    assert j.kept == 0
    j.close()
    assert json.loads(path.read_text().splitlines()[0])["fingerprint"] == FP


@pytest.mark.parametrize("text", ["my own notes", "{}"])
def test_a_file_of_one_unfinished_line_that_is_not_a_journal_is_still_refused(tmp_path, text):
    path = tmp_path / "j.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match="not a ggbatch journal"):
        Journal(str(path), FP)
    assert path.read_text() == text


def test_choices_auto_is_named_auto_not_an_empty_list(tmp_path):
    auto = {"answer": {"choices": [], "grammar": None, "logprobs": False, "choice_logits": True}}
    fixed = {"answer": {**auto["answer"], "choices": ["yes", "no"]}}
    path = str(tmp_path / "j.jsonl")
    journaled(path, auto)
    with pytest.raises(ConfigError, match=r"'answer.choices' changed since the journaled run "
                                          r"\('auto' -> \[\"yes\", \"no\"\]\)"):
        Journal(path, fixed)
    schema = {"answer": {**auto["answer"], "grammar": "root ::= x"}}  # a grammar's empty choices stay []
    assert setting_change(schema, fixed)[1] == []


def test_changed_setting():
    assert changed_setting({"a": 1, "b": 2}, {"a": 1, "b": 2}) is None
    assert changed_setting({"a": 1}, {"a": 1, "c": 3}) == "c"


def test_a_question_whose_own_settings_changed_is_answered_again(tmp_path):
    path = str(tmp_path / "j.jsonl")
    def own(qid, n):
        return Question(qid, array("i", [1, 2]), 0, GenerationParams(max_tokens=n))
    j = Journal(path, FP)
    j.split([own("q1", 8), own("q2", 8), question("q3", 1, 2)])
    j.append([answer("q1"), answer("q2"), Answer(qid="q3", text="t", finish_reason=FinishReason.STOP, prompt_tokens=3,
                                                 completion_tokens=1, created=12.5)])
    j.close()
    j = Journal(path, FP)
    todo, reused = j.split([own("q1", 8), own("q2", 16), question("q3", 1, 2)])
    assert [q.qid for q in todo] == ["q2"] and sorted(reused) == ["q1", "q3"]
    assert reused["q3"].created == 12.5  # an OpenAI line's "created" and ids survive the rerun
    j.close()


@pytest.mark.parametrize("block", [64, 1 << 22])  # read in blocks shorter than a line, or all at once
def test_a_rerun_reads_each_entry_right_whatever_its_text_holds(tmp_path, monkeypatch, block):
    monkeypatch.setattr("ggbatch.runner.journal.index.BLOCK_BYTES", block)
    path = str(tmp_path / "j.jsonl")
    tricky = ['say "error": null', 'a \\ backslash, "quoted"', "日本 \u2028", ', "error": "x"']
    qids = ['plain', 'with "quote"', 'back\\slash', '日本']
    j = Journal(path, FP)
    asked = [question(q, i) for i, q in enumerate(qids)] + [question("failed", 9), question("after", 7)]
    j.split(asked)
    j.append([answer(q, t) for q, t in zip(qids, tricky)])
    j.append([answer("failed", error='boom "error": null')])
    # a choice named "error": its log-probability is a second "error": key, after the answer's own
    j.append([replace(answer("after", "last"), choice_logprobs={"info": -0.1, "error": -3.5})])
    j.close()
    j = Journal(path, FP)
    assert j.kept == 5  # the failed answer is not kept: a rerun answers it again
    todo, reused = j.split(asked)
    assert {q: a.text for q, a in reused.items()} == {**dict(zip(qids, tricky)), "after": "last"}
    assert reused["after"].choice_logprobs == {"info": -0.1, "error": -3.5}
    assert [q.qid for q in todo] == ["failed"]  # a failed answer is retried, whatever its error says
    j.close()


def test_a_line_is_known_by_its_hash_only_while_its_answer_stands(tmp_path):
    from ggbatch.runner.journal.journal import Expected, record_hash

    path = str(tmp_path / "j.jsonl")
    j = Journal(path, FP)
    j.expect("q1", Expected("ab" * 12, record_hash(0x1234)))
    j.expect("q2", Expected("cd" * 12, record_hash(0x5678)))
    j.append([answer("q1"), answer("q2")])
    j.close()
    j = Journal(path, FP)
    assert j.records_known([0x1234, 0x5678, 0x9999]) == ["q1", "q2", None]
    j.expect("q2", Expected("cd" * 12, record_hash(0x5678)))
    j.append([answer("q2", error="failed this time")])
    j.close()
    j = Journal(path, FP)
    assert j.records_known([0x1234, 0x5678]) == ["q1", None]  # retried: parsed and asked again
    j.close()


def test_what_auto_decided_is_journaled_and_a_rerun_on_auto_runs_the_same(tmp_path):
    """A rerun holds only the questions left: on auto it would size a shorter context and decide
    flash attention otherwise, and its answers would not be an uninterrupted run's."""
    path = str(tmp_path / "j.jsonl")
    j = Journal(path, FP)
    assert j.ran("flash_attn") is None  # a new journal: this run decides
    j.record_ran({"flash_attn": True})
    j.record_ran({"flash_attn": False})  # once only
    j.split([question("q1", 1)])
    j.append([answer("q1", "one")])
    j.close()
    lines = open(path).read().splitlines()
    assert json.loads(lines[1]) == {"ggbatch_ran": {"flash_attn": True}} and json.loads(lines[2])["qid"] == "q1"

    j = Journal(path, FP)  # on auto: as the journaled run ran, and its answers are reused
    assert j.ran("flash_attn") is True and j.split([question("q1", 1)])[1]["q1"].text == "one"
    j.record_ran({"flash_attn": False})  # a resumed journal keeps its line
    j.close()
    assert open(path).read().splitlines()[1] == lines[1]
    Journal(path, {**FP, "flash_attn": True}).close()  # named as it ran: accepted
    with pytest.raises(ConfigError, match=r"'flash_attn' changed since the journaled run \(true -> false\)"):
        Journal(path, {**FP, "flash_attn": False})


def test_a_journal_killed_before_its_first_answer_with_its_ran_line_torn_is_made_again(tmp_path):
    path = tmp_path / "j.jsonl"
    Journal(str(path), FP).close()
    with open(path, "ab") as f:
        f.write(b'{"ggbatch_ran": {"flash_')  # killed mid-write: no answer is held
    j = Journal(str(path), {**FP, "sampling.temperature": 0.5})  # another setting: nothing to lose
    assert j.ran("flash_attn") is None
    j.close()


@pytest.mark.parametrize("settings, ran", [({}, True), ({"batch_invariant": True}, False),
                                            ({"answer.choice_scoring": "loglikelihood"}, False)])
def test_a_journal_of_a_version_before_the_ran_line_is_resumed_as_that_version_ran(tmp_path, settings, ran):
    """Such a version ran flash attention on (but batch-invariant, or scoring by log-likelihood):
    a rerun on auto decided afresh, off on a CPU, and the resumed file mixed answers computed
    both ways (a choice's log-probability moved in the fifth digit)."""
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), {**FP, **settings})
    j.split([question("q1", 1)])
    j.append([answer("q1", "one")])
    j.close()
    path.write_bytes(path.read_bytes().replace(b'{"ggbatch_ran": {}}\n', b""))  # as the older version wrote it
    assert b"ggbatch_ran" not in path.read_bytes()
    j = Journal(str(path), {**FP, **settings})
    assert j.ran("flash_attn") is ran and j.split([question("q1", 1)])[1]["q1"].text == "one"
    j.close()
    with pytest.raises(ConfigError, match=f"'flash_attn' changed since the journaled run \\({str(ran).lower()} -> "):
        Journal(str(path), {**FP, **settings, "flash_attn": not ran})
    Journal(str(tmp_path / "new.jsonl"), FP).close()  # a journal without answers yet: the run decides
    j = Journal(str(tmp_path / "new.jsonl"), FP)
    assert j.ran("flash_attn") is None
    j.close()


@pytest.mark.parametrize("line, problem", [
    (b'{"ggbatch_ran":{"flash_attn":false}}\n', None),  # as jq -c writes it: read as JSON, not as bytes
    (b'{"ggbatch_ran": {"flash_attn": null}}\n', "says the run decided flash_attn null, which is not bool"),
    (b'{"ggbatch_ran": {"flash_attn": "false"}}\n', 'says the run decided flash_attn "false", which is not bool'),
    (b'{"ggbatch_ran": {"flash_attn": tru}}\n', "is not what ggbatch writes there"),
    (b'{"ggbatch_ran": []}\n', "is not what ggbatch writes there"),
    (b'{"ggbatch_ran": {"flash_attn": true, "later": 1}}\n', None),  # a later version's key is left alone
])
def test_a_hand_edited_ran_line_is_read_as_json_and_a_bad_value_refused(tmp_path, line, problem):
    """Ignored, it let the rerun decide afresh without a word, and answer otherwise."""
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), FP)
    j.record_ran({"flash_attn": True})
    j.split([question("q1", 1)])
    j.append([answer("q1", "one")])
    j.close()
    head, _, *rest = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(head + line + b"".join(rest))
    if problem is None:
        j = Journal(str(path), FP)
        assert j.ran("flash_attn") in (True, False) and j.split([question("q1", 1)])[1]["q1"].text == "one"
        j.close()
    else:
        with pytest.raises(ConfigError, match=f"j.jsonl: its second line.*{problem}.*remove that line \\(its "
                                              "answers are then taken for a version's before that line\\), or pass "
                                              "fresh=True to start over"):
            Journal(str(path), FP)


@contextmanager
def file_size_limit(limit):
    """ulimit -f for this process (Python ignores SIGXFSZ: a write past it fails with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_write_cut_part_way_keeps_the_answers_whose_lines_reached_the_file_whole(tmp_path):
    """One message's answers go out in one write; a full disk or ulimit -f takes part of it. The
    lines before the cut are in the file (a rerun resumes from them), so they are this run's answers
    too: before, none of them was, and the answers file wrote them 'not answered'."""
    qids = [f"q{i}" for i in range(5)]
    sizing = tmp_path / "sizing.jsonl"
    j = Journal(str(sizing), FP)
    start = sizing.stat().st_size
    j.split([question("q0", 1)])
    j.append([answer("q0", "answer q0")])
    line = sizing.stat().st_size - start  # every line is as long: ids and texts of one length
    j.close()
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), FP)
    j.split([question(q, i) for i, q in enumerate(qids)])
    with file_size_limit(start + 2 * line + line // 2), pytest.raises(JournalError, match=r"cannot append to the "
                                                                      r"journal \(File too large\)"):
        j.append([answer(q, f"answer {q}") for q in qids])
    assert [a and a.text for a in map(j.answer, qids)] == ["answer q0", "answer q1", None, None, None]
    j.close()
    assert path.stat().st_size == start + 2 * line + line // 2  # the cut third line is still there
    j = Journal(str(path), FP)  # the rerun resumes from the two whole lines, and drops the cut one
    todo, reused = j.split([question(q, i) for i, q in enumerate(qids)])
    assert j.kept == 2 and sorted(reused) == ["q0", "q1"] and [q.qid for q in todo] == qids[2:]
    j.append([answer(q, f"again {q}") for q in qids[2:]])
    j.close()
    assert [json.loads(e)["qid"] for e in path.read_text().splitlines()[1:]] == qids  # after the header


def test_the_index_reads_every_shape_of_entry_as_parsing_it_would():
    """The index finds each entry's id, hashes and whether it failed by a regex over the line
    (runner/journal/index.py), not by parsing it: for every optional field entry_of writes
    (choices named like its keys among them), it reads what json.loads reads."""
    logprob = TokenLogprob(5, b'"error": ', -0.5, ((5, b'"error": ', -0.5), (6, b"null", -1.2)))
    shapes = [
        make_answer("plain", "t"),
        make_answer("failed", "", error='"error": null'),
        make_answer("choices", "error", choice_logprobs={"text": -3.0, "error": -0.1, "qid": -4.0}),
        make_answer("failed choices", "", error="cut", choice_logprobs={"info": -0.5, "error": None}),
        make_answer("logprobs", '"error": null', token_logprobs=(logprob,), answer_norm="error"),
        make_answer("samples", "a", samples=(Sample("a", FinishReason.STOP, 1, (logprob,)),
                                             Sample("", FinishReason.LENGTH, 2, None, True, '"error": null')),
                    in_thinking=True),
    ]
    block = b"".join(json.dumps(entry_of(a, "ab" * 8, "cd" * 8)).encode() + b"\n" for a in shapes)
    assert len(ENTRY.findall(block)) == len(shapes)  # each line read by the regex, none parsed
    fast, parsed = block_entries(block, 0), parsed_entries(block, 0)
    assert fast == parsed and fast.ok == [a.error is None for a in shapes]
