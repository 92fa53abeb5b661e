"""A file of more records than one window streams (runner/questions/feed.py, runner/questions/prepare.py): windows
made while the workers answer, answers kept in the journal and written from it. Here with a
window of a few dozen records, through run_job with the fake engine and the real tokenizer."""

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from fake_engine import Fake
from ggbatch import build_config
from ggbatch.runner.errors import ConfigError, InputError, Interrupted, WorkerFailure
from ggbatch.runner.job import run_job
from ggbatch.runner.pool.signals import STOP
from helpers import wait_for

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]


def questions(path, n, line=None):
    """n questions; every 7th asks what the question 6 before it asked (q7 what q1 asked, and
    across windows)."""
    with open(path, "w") as f:
        for i in range(n):
            j = i - 6 if i % 7 == 0 and i else i
            text = f"What is {j} plus {j % 13}?"
            f.write(line(i) if line and line(i) else json.dumps({"questionID": f"q{i}", "question": text}) + "\n")


def job(tmp_path, demo_model, out, **keys):
    return build_config([("t", {"model": demo_model, "input": str(tmp_path / "q.jsonl"), "output": str(out),
                                "workers": 2, "slots": 4, "max_tokens": 4, **keys})])


def test_a_streamed_file_answers_exactly_as_one_window_does(tmp_path, demo_model):
    questions(tmp_path / "q.jsonl", 500)
    one, streamed = tmp_path / "one.json", tmp_path / "streamed.json"
    whole = run_job(job(tmp_path, demo_model, one), engine_factory=Fake(), progress="log")
    report = run_job(job(tmp_path, demo_model, streamed), engine_factory=Fake(), progress="log", window=40)
    assert streamed.read_bytes() == one.read_bytes()
    rows = json.loads(streamed.read_text())
    assert [r["questionID"] for r in rows] == [f"q{i}" for i in range(500)]
    assert all(r["answer"].startswith("answer to q") for r in rows)
    # Identical prompts are answered once across windows too: q7 asks what q1 asked.
    assert rows[7]["answer"] == rows[1]["answer"] and rows[7]["answer"].startswith("answer to q1 ")
    q = report.as_json()["questions"]
    assert q == {**whole.as_json()["questions"]} and q["records"] == 500 and q["unique_prompts"] < 500


def test_formats_stream_too(tmp_path, demo_model):
    questions(tmp_path / "q.jsonl", 120)
    for name in ("a.csv", "a.jsonl"):
        one, streamed = tmp_path / f"one-{name}", tmp_path / f"streamed-{name}"
        run_job(job(tmp_path, demo_model, one), engine_factory=Fake(), progress="log")
        run_job(job(tmp_path, demo_model, streamed), engine_factory=Fake(), progress="log", window=25)
        assert streamed.read_bytes() == one.read_bytes()


def test_a_streamed_run_that_dies_resumes_from_the_journal_to_the_same_answers(tmp_path, demo_model):
    questions(tmp_path / "q.jsonl", 300)
    out, reference = tmp_path / "a.json", tmp_path / "reference.json"
    whole = run_job(job(tmp_path, demo_model, reference), engine_factory=Fake(), progress="log", window=30)
    dying = Fake(exit_after=100, marker=str(tmp_path / "died"), fail_load_once_marked=True)
    with pytest.raises(WorkerFailure, match="no worker can start any more"):
        run_job(job(tmp_path, demo_model, out, workers=1), engine_factory=dying, progress="log", window=30)
    rows = json.loads(out.read_text())
    # Every question has its row, those not read yet too, each saying why it has no answer.
    assert [r["questionID"] for r in rows] == [f"q{i}" for i in range(300)]
    unanswered = [r for r in rows if r["answer"] is None]
    assert unanswered and all(r["error"].startswith("not answered: no worker can start") for r in unanswered)
    again = run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=30)
    assert out.read_bytes() == reference.read_bytes()
    q = again.as_json()["questions"]
    assert q["from_journal"] >= 80 and {**q, "from_journal": 0} == whole.as_json()["questions"]


def test_a_tokenizer_process_killed_mid_run_is_started_again_and_the_run_goes_on(tmp_path, demo_model):
    """The out-of-memory killer may pick the tokenizer process while the windows are still being
    made: the run starts a new one, as a warm pool does, and answers every question (it ended
    the whole run: "the tokenizer process died (signal 9)"). The real engine and processes."""
    questions(tmp_path / "q.jsonl", 240)
    out = tmp_path / "a.json"
    journal = Path(f"{out}.journal.jsonl")
    killed: list[int] = []

    def kill_the_tokenizer() -> None:
        wait_for(journal.exists, what="the journal (the tokenizer has loaded and the windows are being made)")
        (tokenizer,) = [p for p in psutil.Process().children() if p.name().startswith("ggbatch-tok")]
        tokenizer.kill()
        killed.append(tokenizer.pid)

    killer = threading.Thread(target=kill_the_tokenizer, daemon=True)
    killer.start()
    report = run_job(job(tmp_path, demo_model, out), progress="log", window=20)
    killer.join(30)
    assert killed
    rows = json.loads(out.read_text())
    assert len(rows) == 240 and all(r.get("error") is None and r["answer"] is not None for r in rows)
    assert report.as_json()["questions"]["records"] == 240


def test_a_bad_line_far_into_a_streamed_file_stops_the_run_naming_it_and_keeps_the_answers(tmp_path, demo_model):
    questions(tmp_path / "q.jsonl", 12000, line=lambda i: '{"questionID": "q", "question": \n' if i == 11000 else None)
    out = tmp_path / "a.json"
    with pytest.raises(InputError, match=r"q.jsonl:11001: malformed JSON") as err:
        run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=500)
    # it said the line and no more, as though every answer were lost with the run
    assert str(err.value).endswith(f"; the answers so far are kept in the journal {out}.journal.jsonl: fix what "
                                   "this names and run the same command again, which answers only the rest")
    journal = (tmp_path / "a.json.journal.jsonl").read_text().splitlines()
    assert len(journal) > 5000  # the windows before it were answered, and are kept for the rerun


def test_a_record_far_into_a_file_its_template_fails_says_the_answers_are_kept(tmp_path, demo_model):
    questions(tmp_path / "q.jsonl", 3000, line=lambda i: '{"questionID": "late", "question": "x"}\n' if i == 2500 else
              json.dumps({"questionID": f"q{i}", "question": f"What is {i} plus 2?", "hint": "add"}) + "\n")
    out = tmp_path / "a.json"
    with pytest.raises(ConfigError) as err:
        run_job(job(tmp_path, demo_model, out, **{"prompt.template": "{{question}} ({{hint}})"}), engine_factory=Fake(),
                progress="log", window=500)
    assert str(err.value) == (f"{tmp_path / 'q.jsonl'}:2501: record 'late' has no field 'hint' that prompt.template "
                              "uses (its fields: 'questionID, question'); the answers so far are kept in the journal "
                              f"{out}.journal.jsonl: fix what this names and run the same command again, which "
                              "answers only the rest")
    assert len((tmp_path / "a.json.journal.jsonl").read_text().splitlines()) > 1000


def test_integer_ids_stay_integers_when_a_rerun_reuses_lines_without_parsing_them(tmp_path, demo_model):
    """A rerun takes a line the journal answered as it is, unparsed: its id, an integer in the
    file, was taken for text, and every id of the answers file was written as text."""
    def line(i):  # 1.9 MB: lines past the first reads (runner/files/inputs.py READ_BYTES) are looked up
        return json.dumps({"questionID": i, "question": f"{i} plus 1?", "notes": "x" * 100}) + "\n"
    questions(tmp_path / "q.jsonl", 12000, line=line)
    out = tmp_path / "a.jsonl"
    for _ in range(2):
        run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=100)
        assert [json.loads(line)["questionID"] for line in out.read_text().splitlines()] == list(range(12000))


def test_peak_memory_of_the_coordinator_stays_small_for_100000_questions(tmp_path, demo_model):
    """The coordinator alone (the workers and the tokenizer are processes of their own), in a
    fresh process so that the peak is this run's (the report's, from VmHWM: getrusage's peak
    would be this big pytest process's, kept across exec)."""
    path = tmp_path / "q.jsonl"
    with open(path, "w") as f:
        for i in range(100_000):
            f.write(json.dumps({"questionID": f"id-{i:07d}", "question": f"What is {i} times {i % 89}? " * 3}) + "\n")
    code = (f"import sys, json; sys.path[:0] = {[str(ROOT), str(ROOT / 'tests')]!r}\n"
            "from fake_engine import Fake\nfrom ggbatch import build_config\nfrom ggbatch.runner.job import run_job\n"
            "if __name__ == '__main__':\n"
            f"    c = build_config([('t', {{'model': {demo_model!r}, 'input': {str(path)!r}, "
            f"'output': {str(tmp_path / 'a.jsonl')!r}, 'workers': 2, 'slots': 64, 'max_tokens': 2}})])\n"
            "    r = run_job(c, engine_factory=Fake(), progress='off')\n"
            "    print(json.dumps([r.as_json()['memory']['coordinator_peak_rss_mib'], "
            "r.as_json()['questions']['answered']]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-2000:]
    peak_mib, answered = json.loads(done.stdout.strip().splitlines()[-1])
    assert answered == 100_000
    assert sum(1 for _ in open(tmp_path / "a.jsonl")) == 100_000
    # Before streaming: about 2 KB a question (200 MiB here). Now the windows and ~60 bytes a question.
    assert peak_mib < 120, f"coordinator peak RSS {peak_mib} MiB"


def test_a_line_edited_since_is_answered_again_and_only_it(tmp_path, demo_model):
    questions(tmp_path / "q.jsonl", 300)
    out = tmp_path / "a.json"
    run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=40)
    before = json.loads(out.read_text())
    lines = (tmp_path / "q.jsonl").read_text().splitlines(keepends=True)
    lines[250] = json.dumps({"questionID": "q250", "question": "An edited question, longer than it was?"}) + "\n"
    (tmp_path / "q.jsonl").write_text("".join(lines))
    again = run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=40)
    q = again.as_json()["questions"]
    assert again.outcome.tally.made == 1 and q["from_journal"] == q["records"] - 1
    rows = json.loads(out.read_text())
    assert rows[250]["answer"].startswith("answer to q250") and rows[250] != before[250]
    assert rows[:250] == before[:250] and rows[251:] == before[251:]


def test_a_streamed_file_stopped_twice_is_finished_by_a_rerun_exactly_as_one_run(tmp_path, demo_model, monkeypatch):
    """The feed thread reuses a window's journaled answers while the pool's thread journals new
    ones, both into one index: merged every few additions here, and threads switched as often as
    the interpreter can, a lost or torn merge shows as a crash or a missing answer."""
    from ggbatch.runner.files import compact as columns
    monkeypatch.setattr(columns, "MERGE_AT", 8)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        questions(tmp_path / "q.jsonl", 600)
        out, reference = tmp_path / "a.jsonl", tmp_path / "reference.jsonl"
        run_job(job(tmp_path, demo_model, reference), engine_factory=Fake(), progress="log", window=30)
        for stop in ("first", "second"):
            dying = Fake(exit_after=150, marker=str(tmp_path / f"died-{stop}"), fail_load_once_marked=True)
            with pytest.raises(WorkerFailure, match="no worker can start any more"):
                run_job(job(tmp_path, demo_model, out, workers=1), engine_factory=dying, progress="log", window=30)
        again = run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=30)
    finally:
        sys.setswitchinterval(interval)
    assert out.read_bytes() == reference.read_bytes()
    assert again.as_json()["questions"]["from_journal"] >= 250


def test_a_rerun_of_a_finished_streamed_job_stopped_at_once_writes_every_answer_again(tmp_path, demo_model):
    """A stop before the rerun's first window is made: the windows the feed never made are read
    for the answers file, and the journal holds an answer for each record as written (a cron
    job's `timeout` once turned a finished file into one whose later windows all said "not
    answered"). Every prompt differs here: a record asking what an earlier one asked has no
    entry of its own, and is known for the other's only once its prompt is made."""
    questions(tmp_path / "q.jsonl", 300, line=lambda i: json.dumps({"questionID": f"q{i}", "question": f"Is {i} odd?"})
              + "\n")
    out = tmp_path / "a.json"
    run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=30)
    finished = out.read_bytes()
    STOP.install()
    try:
        signal.raise_signal(signal.SIGTERM)  # remembered until the run's pool is attached
        with pytest.raises(Interrupted):
            run_job(job(tmp_path, demo_model, out), engine_factory=Fake(), progress="log", window=30)
    finally:
        STOP.uninstall()
    assert out.read_bytes() == finished


def test_a_run_removes_the_copies_a_killed_run_left_while_writing_its_answers(tmp_path, demo_model):
    questions(tmp_path / "q.jsonl", 20)
    out, errors = tmp_path / "a.json", tmp_path / "e.jsonl"
    left = [tmp_path / ".a.json.k3j_9x0q.tmp", tmp_path / ".e.jsonl.0abcdefg.tmp"]  # mkstemp's names
    others = [tmp_path / ".b.json.k3j_9x0q.tmp", tmp_path / ".a.json.mine.tmp", tmp_path / "a.json.k3j_9x0q.tmp"]
    for path in left + others:
        path.write_text("[")
    run_job(job(tmp_path, demo_model, out, errors_output=str(errors)), engine_factory=Fake(), progress="log")
    assert not any(path.exists() for path in left) and all(path.exists() for path in others)
    assert len(json.loads(out.read_text())) == 20
