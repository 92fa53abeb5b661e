"""The command line's small courtesies: --version, -q, words that agree with their numbers."""

from __future__ import annotations

import json
import re

import pytest

from helpers import ggbatch as cli

pytestmark = [pytest.mark.timeout(120), pytest.mark.model]


def ggbatch(*args, timeout=100):
    return cli(*args, timeout=timeout)


def test_version_names_ggbatch_llama_cpp_python_llama_cpp_and_the_cpu():
    r = ggbatch("--version")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ggbatch ") and lines[1] == "llama-cpp-python 0.3.36"
    assert lines[2].startswith("llama.cpp ggml ") and "commit" in lines[2]
    assert lines[3].startswith("llama.cpp GPU offload: ")  # "no (a CPU-only build ..." here
    assert lines[4].startswith("llama.cpp system info: CPU :")


def test_quiet_prints_nothing_and_the_exit_code_says_it(tmp_path, demo_model, questions_file):
    out = tmp_path / "a.json"
    r = ggbatch("run", "-q", "--model", demo_model, "--input", questions_file(3), "--output", out, "--max-tokens", 4,
                "--workers", 1)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
    assert len(json.loads(out.read_text())) == 3
    bad = ggbatch("run", "-q", "--model", demo_model, "--input", tmp_path / "none.jsonl", "--output", out)
    assert bad.returncode == 2 and bad.stderr.startswith("ggbatch: error: ") and bad.stdout == ""


def test_one_worker_reads_one_worker(tmp_path, demo_model, questions_file):
    r = ggbatch("run", "--model", demo_model, "--input", questions_file(1), "--output", tmp_path / "a.json",
                "--max-tokens", 2, "--workers", 1, "--threads", 1, "--progress", "off")
    assert r.returncode == 0, r.stderr
    assert "layout     1 worker × 1 thread × 1 slot, " in r.stdout
    assert "worker 0   cores [0], 1 question, " in r.stdout and "wrote 1 answer to " in r.stdout


def test_a_misspelt_flag_is_named_with_the_closest_one_and_the_subcommands_help(tmp_path):
    r = ggbatch("run", "--input", tmp_path / "q.jsonl", "--max-tokns=3")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("ggbatch run: error: unrecognized arguments: --max-tokns=3; did you mean --max-tokens? "
                        "(`ggbatch run --help` lists the options)\n")
    two = ggbatch("merge", "--output", tmp_path / "a.json", "--quite", "--output-formt=csv", tmp_path / "a.jsonl")
    assert "--quite: did you mean --quiet?; --output-formt: did you mean --output-format?" in two.stderr, two.stderr
    unknown = ggbatch("score", "--answers", "a", "--gold", "b", "--zzz")
    assert unknown.stderr.endswith("unrecognized arguments: --zzz (`ggbatch score --help` lists the options)\n")


def test_a_misspelt_required_flag_is_named_with_the_closest_one(tmp_path):
    # argparse's "required" error comes before the unknown words reach the hint
    r = ggbatch("merge", "--ouput", tmp_path / "m.jsonl", tmp_path / "a.jsonl")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("ggbatch merge: error: the following arguments are required: --output; --ouput: did you "
                        "mean --output? (`ggbatch merge --help` lists the options)\n")
    score = ggbatch("score", "--answers", "a.jsonl", "--gld", "g.jsonl")
    assert "required: --gold; --gld: did you mean --gold? (" in score.stderr, score.stderr
    eval_ = ggbatch("eval", "--modle", "m.gguf", "--tasks", "x")
    assert "required: --model; --modle: did you mean --model? (" in eval_.stderr, eval_.stderr
    two = ggbatch("bench", "--modle", "m.gguf", "--npll", "1")
    assert "--modle: did you mean --model?; --npll: did you mean --npl? (" in two.stderr, two.stderr
    typed = ggbatch("merge", "--input", tmp_path / "q.jsonl", tmp_path / "a.jsonl")  # nothing misspelt
    assert typed.stderr == ("ggbatch merge: error: the following arguments are required: --output "
                            "(`ggbatch merge --help` lists the options)\n")


def test_the_help_offers_no_ray_address_the_check_refuses():
    """`run --help` offered `--ray-address none` (an instance of the job's own), which was refused:
    leaving the flag out is how (docs/guide/ray.md), and a `none` given says so."""
    entry = " ".join(ggbatch("run", "--help").stdout.split()).rsplit("--ray-address RAY_ADDRESS", 1)[1]
    entry = re.split(r" --[\w-]+ [A-Z_]{2,} ", entry)[0]  # up to the next flag's entry
    assert "auto or HOST:PORT" in entry and "left out: start a Ray instance of its own" in entry, entry
    assert "none" not in entry, entry
    given = ggbatch("run", "--model", "m.gguf", "--input", "q.jsonl", "--output", "a.jsonl", "--backend", "ray",
                    "--ray-address", "none")
    assert given.returncode == 2 and given.stderr == (
        "ggbatch: error: command line: ray_address: must be auto or HOST:PORT (a Ray head's address, as `ray start "
        "--head` prints it); for a Ray instance of the job's own on this machine leave ray_address (--ray-address) "
        "out, got 'none'\n"), given.stderr


def test_every_run_flag_sets_the_job_key_it_names_or_is_runs_own():
    """A flag's dest is the job key it sets (runner/cli.py _key_flag): one misspelt would be dropped
    from the command line's layer without a word, so each must be a key of the table."""
    from ggbatch.runner.cli import _command_parser, _flag_layer, build_parser
    from ggbatch.runner.config.keys import SCHEMA

    run = _command_parser(build_parser(), "run")
    own = {"help", "job", "fresh", "score", "progress", "verbose", "quiet"}
    dests = {action.dest for action in run._actions}
    assert dests - own <= set(SCHEMA), dests - own - set(SCHEMA)
    args = build_parser().parse_args(["run", "--top-k", "5", "-ngl", "all", "--id-field", "id", "--no-choice-logprobs",
                                      "--thinking-budget", "9", "--model", "m.gguf"])
    assert _flag_layer(args) == {"sampling.top_k": "5", "model.n_gpu_layers": "all", "fields.id": "id",
                                 "answer.logprobs": False, "reasoning.max_tokens": "9", "model": "m.gguf"}


@pytest.mark.parametrize("flag, key, field", [
    ("ignore-eos", "ignore_eos", "ignore_eos"), ("batch-invariant", "batch_invariant", "batch_invariant"),
    ("keep-thinking", "keep_thinking", "keep_thinking"), ("choice-logprobs", "answer.logprobs", "choice_logprobs")])
def test_a_boolean_flag_turns_a_job_files_key_off_as_well_as_on(tmp_path, flag, key, field):
    """A job file's `ignore_eos: true` could not be turned off: the flags were store_true, so
    `--no-ignore-eos` was 'did you mean --ignore-eos?', though flags override the job file."""
    from ggbatch.runner.cli import _flag_layer, build_parser
    from ggbatch.runner.config.job_file import load_job_file
    from ggbatch.runner.config.schema import build_config

    job = tmp_path / "job.yaml"
    job.write_text(f"model: m.gguf\ninput: q.jsonl\noutput: a.json\nanswer.choices: A,B\n{key}: true\n")
    for given, value in (([], True), ([f"--no-{flag}"], False), ([f"--{flag}"], True)):
        args = build_parser().parse_args(["run", str(job), *given])
        config = build_config([(str(job), load_job_file(str(job))), ("command line", _flag_layer(args))])
        assert getattr(config, field) is value, given
    assert _flag_layer(build_parser().parse_args(["run", str(job)])) == {}  # neither: the job file's stands


def test_no_ignore_eos_overrides_the_job_file_in_a_real_run(tmp_path, demo_model, questions_file):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {demo_model}\ninput: {questions_file(2)}\noutput: {tmp_path / 'a.json'}\n"
                   "ignore_eos: true\nbatch_invariant: true\nmax_tokens: 4\n")
    r = ggbatch("run", job, "--no-ignore-eos", "--no-batch-invariant", "-q", "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["generation"]["ignore_eos"] is False and report["layout"]["batch_invariant"] is False
