"""A stopped job resumes whatever its settings: every job key that decides an answer is compared
with the journal's in the one form the journal holds (JSON), so a choices list, a grammar or a
schema read back from the journal matches the same settings given again; and an answer is reused
only for the prompt it answered (a relabelled CSV header asks other questions)."""

import json
import subprocess

import pytest

from conftest import ROOT
from fake_engine import Fake
from ggbatch import build_config
from ggbatch.runner.job import run_job
from helpers import choice_records, ggbatch_command

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}

# Each case: the flags of a job whose settings came back from the journal in another spelling.
CASES = {
    "choices": ["--choices", "A,B"],
    "choices with logprobs": ["--choices", "A,B,C,D", "--choice-logprobs"],
    "choices auto": ["--choices", "auto"],
    "grammar": ["--grammar", 'root ::= ("yes" | "no") "."'],
    # room for the whole object on the demo model: one cut before it is complete fails
    "json schema": ["--json-schema", "{schema}", "--max-tokens", "24"],
    "sampling, stop, system": ["--temperature", "0.8", "--seed", "11", "--top-k", "5", "--stop", "\n",
                               "--stop", ".", "--system", "Answer briefly."],
    "job file: template kwargs and stop list": ["{job}"],
}


def _files(tmp_path):
    (tmp_path / "yn.gbnf").write_text('root ::= ("yes" | "no") "."\n')
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "job.yaml").write_text("stop: ['\\n', '?']\nprompt:\n  template_kwargs: {enable_thinking: false, "
                                       "tools: [a, b]}\nsampling: {temperature: 0.5, seed: 3}\n")
    lines = [json.dumps(r) for r in choice_records(12)]  # MMLU-like: four lettered choices each
    (tmp_path / "half.jsonl").write_text("\n".join(lines[:6]) + "\n", encoding="utf-8")
    (tmp_path / "all.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _run(tmp_path, demo_model, flags, questions):
    """`ggbatch run [job.yaml] --model ... <flags>` (a job file comes first, as the CLI takes it)."""
    given = [f.format(grammar=tmp_path / "yn.gbnf", schema=tmp_path / "s.json", job=tmp_path / "job.yaml")
             for f in flags]
    job_file = [f for f in given if f.endswith(".yaml")]
    flags = [f for f in given if not f.endswith(".yaml")]
    cmd = ggbatch_command("run", *job_file, "--model", demo_model, "--input", tmp_path / questions,
                          "--output", tmp_path / "a.jsonl", "--report", tmp_path / "report.json", "--max-tokens", "6",
                          "--workers", "1", "--threads", "1", "--slots", "4", *flags)
    return subprocess.run(list(map(str, cmd)), cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("flags", list(CASES.values()), ids=list(CASES))
def test_a_stopped_job_resumes_whatever_its_answer_and_sampling_keys(tmp_path, demo_model, flags):
    _files(tmp_path)
    first = _run(tmp_path, demo_model, flags, "half.jsonl")  # the run that was stopped half way
    assert first.returncode == 0, first.stderr[-2000:]
    again = _run(tmp_path, demo_model, flags, "all.jsonl")
    assert again.returncode == 0, again.stderr[-2000:]
    questions = json.loads((tmp_path / "report.json").read_text())["questions"]
    assert questions["from_journal"] == 6 and questions["records"] == 12
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r.get("error") is None and r["answer"] is not None for r in rows)


@pytest.mark.model
@pytest.mark.timeout(300)
def test_answer_with_a_resume_folder_called_twice_takes_the_journal(tmp_path, demo_model):
    import ggbatch

    questions = ["Is the sky blue?", "Is grass red?", "Do cats bark?"]
    settings = dict(model=demo_model, resume_dir=str(tmp_path), answer={"choices": ["yes", "no"]}, max_tokens=4,
                    workers=1, threads=1, report=str(tmp_path / "report.json"))
    first = ggbatch.answer(questions, **settings)
    again = ggbatch.answer(questions, **settings)
    assert again == first and {a.text for a in again} <= {"yes", "no"}
    assert json.loads((tmp_path / "report.json").read_text())["questions"]["from_journal"] == 3


def _csv_job(tmp_path, demo_model, **keys):
    return build_config([("t", {"model": demo_model, "input": str(tmp_path / "q.csv"),
                                "output": str(tmp_path / "a.jsonl"), "workers": 1, "slots": 4, "max_tokens": 4,
                                **keys})])


def _write_csv(tmp_path, header):
    rows = [f"q{i},What is {i} plus {i}?,from page {i * 7}" for i in range(10)]
    (tmp_path / "q.csv").write_text("\n".join([header, *rows]) + "\n")


@pytest.mark.model
@pytest.mark.timeout(180)
@pytest.mark.parametrize("template", [None, "{{ question }} (see {{ notes }})"])
def test_a_relabelled_csv_header_reuses_an_answer_only_for_the_prompt_it_answered(tmp_path, demo_model, template):
    keys = {"prompt.template": template} if template else {}
    _write_csv(tmp_path, "questionID,question,notes")
    run_job(_csv_job(tmp_path, demo_model, **keys), engine_factory=Fake(), progress="off")
    # The header corrected: the second column was the notes, the third the questions.
    _write_csv(tmp_path, "questionID,notes,question")
    swapped = run_job(_csv_job(tmp_path, demo_model, **keys), engine_factory=Fake(), progress="off")
    assert swapped.as_json()["questions"]["from_journal"] == 0 and swapped.outcome.tally.made == 10


@pytest.mark.model
@pytest.mark.timeout(180)
def test_a_renamed_column_that_no_prompt_reads_keeps_every_answer(tmp_path, demo_model):
    _write_csv(tmp_path, "questionID,question,notes")
    run_job(_csv_job(tmp_path, demo_model), engine_factory=Fake(), progress="off")
    _write_csv(tmp_path, "questionID,question,remarks")
    renamed = run_job(_csv_job(tmp_path, demo_model), engine_factory=Fake(), progress="off")
    assert renamed.as_json()["questions"]["from_journal"] == 10 and renamed.outcome.tally.made == 0
