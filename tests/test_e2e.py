"""End to end through the command line, with real llama.cpp in real worker processes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, two_cores
from ggbatch.runner.plan.tuned import context_bucket
from helpers import ggbatch as cli
from helpers import ggbatch_command, repack_refusal, repack_runs

pytestmark = [pytest.mark.timeout(240), pytest.mark.model]


def ggbatch(*args, timeout=200):
    return cli("run", *args, timeout=timeout)


@pytest.mark.parametrize("model", ["file", "demo"])
def test_two_pinned_workers_answer_50_questions_in_input_order(request, tmp_path, questions_file, model):
    two_cores()
    model_path = request.getfixturevalue("demo_model") if model == "file" else "demo"
    questions, out, report = questions_file(50), tmp_path / "answers.json", tmp_path / "report.json"
    r = ggbatch("--model", model_path, "--input", questions, "--output", out, "--workers", 2,
                "--max-tokens", 16, "--report", report)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert [row["questionID"] for row in rows] == [f"q{i}" for i in range(50)]
    assert all(isinstance(row["answer"], str) and row["answer"] for row in rows)
    rep = json.loads(report.read_text())
    workers = rep["workers"]
    assert len(workers) == 2
    # Pinned to disjoint single cores (read from outside with psutil), one llama.cpp thread each.
    affinities = [tuple(w["affinity"]) for w in workers.values()]
    assert all(len(a) == 1 for a in affinities) and len(set(affinities)) == 2
    assert affinities == [tuple(w["cores"]) for w in workers.values()]
    # On a busy machine one worker may still be loading when the other has answered all 50 (the
    # demo model is quick): it never said Ready, so no thread count, and it answered nothing.
    assert all(w["llama_n_threads"] == 1 or (w["llama_n_threads"] is None and w["questions"] == 0)
               for w in workers.values()), workers
    assert sum(w["questions"] for w in workers.values()) == 50
    assert rep["questions"]["answered"] == 50 and rep["questions"]["failed"] == 0
    assert "answered   50/50" in r.stdout


def test_one_worker_gets_every_core_by_default(tmp_path, demo_q4_model, questions_file):
    out, report = tmp_path / "a.jsonl", tmp_path / "r.json"
    r = ggbatch("--model", demo_q4_model, "--input", questions_file(5), "--output", out, "--max-tokens", 8,
                "--report", report)
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert [json.loads(line)["questionID"] for line in lines] == [f"q{i}" for i in range(5)]
    data = json.loads(report.read_text())
    w = data["workers"]["0"]
    cores = sorted(os.sched_getaffinity(0))
    assert w["affinity"] == cores and w["llama_n_threads"] == len(cores)
    # 5 questions: 5 slots, too few for the plain kernels anywhere, so llama.cpp's default, unless
    # this CPU refuses the repacked kernels
    expected = (True, "auto: llama.cpp default") if repack_runs() else (False, repack_refusal())
    assert (data["layout"]["repack_weights"], data["layout"]["repack_reason"]) == expected
    # no layer on a GPU: flash attention off on auto (runner/plan/attention.py), as the summary says
    assert data["layout"]["flash_attn"] is False and "flash attention off" in r.stdout


@pytest.mark.slow
def test_example_job_runs(tmp_path):
    out = tmp_path / "example.json"
    r = ggbatch("jobs/example.yaml", "--output", out, "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 12 and all(row["answer"] for row in rows)


def test_missing_model_is_one_line_exit_2(tmp_path, questions_file):
    r = ggbatch("--model", tmp_path / "nope.gguf", "--input", questions_file(3), "--output", tmp_path / "a.json")
    assert r.returncode == 2
    assert r.stderr.strip() == f"ggbatch: error: {tmp_path / 'nope.gguf'}: model file not found"


def test_file_that_is_not_gguf_is_exit_2(tmp_path, questions_file):
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello")
    r = ggbatch("--model", fake, "--input", questions_file(3), "--output", tmp_path / "a.json")
    assert r.returncode == 2 and "not a GGUF file" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_malformed_input_line_is_one_line_exit_2_and_nothing_written(tmp_path, demo_model):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"questionID": "1", "question": "a"}\n{"questionID": "2", "question": "b"\n')
    out = tmp_path / "a.json"
    out.write_text("previous answers")
    r = ggbatch("--model", demo_model, "--input", questions, "--output", out)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"ggbatch: error: {questions}:2: malformed JSON")
    assert len(r.stderr.strip().splitlines()) == 1
    assert out.read_text() == "previous answers"


def test_empty_input_gives_empty_output(tmp_path, demo_model):
    questions = tmp_path / "q.jsonl"
    questions.write_text("")
    r = ggbatch("--model", demo_model, "--input", questions, "--output", tmp_path / "a.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "a.json").read_text()) == []


def test_failed_question_is_recorded_and_exit_1(tmp_path, demo_model):
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{"questionID": "short", "question": "Hi"},
                                     {"questionID": "long", "question": "word " * 300}]))
    r = ggbatch("--model", demo_model, "--input", questions, "--output", tmp_path / "a.json",
                "--n-ctx", 64, "--max-tokens", 8)
    assert r.returncode == 1, r.stderr
    rows = {row["questionID"]: row for row in json.loads((tmp_path / "a.json").read_text())}
    assert rows["short"]["answer"]
    assert rows["long"]["answer"] is None and "context per sequence is 64" in rows["long"]["error"]
    assert "trained for" not in r.stderr


def test_a_context_past_the_models_training_context_is_warned_of(tmp_path, demo_model, questions_file):
    r = ggbatch("--model", demo_model, "--input", questions_file(2), "--output", tmp_path / "a.json",
                "--n-ctx", 4096, "--max-tokens", 4, "--workers", 1)
    assert r.returncode == 0, r.stderr
    assert "model.n_ctx: 4096 is more than the 2048 tokens of context the model was trained for" in r.stderr


def test_too_many_workers_is_a_usage_error(tmp_path, demo_model, questions_file):
    n = len(os.sched_getaffinity(0)) + 1
    r = ggbatch("--model", demo_model, "--input", questions_file(3), "--output", tmp_path / "a.json", "--workers", n)
    assert r.returncode == 2 and f"{n} workers need at least {n} cores" in r.stderr


def test_python_api_returns_the_report(tmp_path, demo_model, questions_file):
    from ggbatch import build_config, run_job

    config = build_config([("api", {"model": demo_model, "input": questions_file(4), "output": str(tmp_path / "a.json"),
                                    "max_tokens": 8, "workers": 1})])
    report = run_job(config, progress="log")
    assert (report.answered, report.failed) == (4, 0)
    assert 0 < report.as_json()["tokens"]["generated"] <= 4 * 8
    assert Path(tmp_path / "a.json").exists()


def test_identical_prompts_answered_once_and_report_adds_up(tmp_path, demo_model):
    questions = tmp_path / "q.jsonl"
    texts = ["Once upon a time", "The dog ran", "Once upon a time", "A big red ball", "The dog ran"]
    questions.write_text("".join(json.dumps({"questionID": f"d{i}", "question": t}) + "\n"
                                 for i, t in enumerate(texts)))
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    r = ggbatch("--model", demo_model, "--input", questions, "--output", out, "--max-tokens", 12,
                "--report", report, "--workers", 1)
    assert r.returncode == 0, r.stderr
    rows = {row["questionID"]: row["answer"] for row in json.loads(out.read_text())}
    assert rows["d0"] == rows["d2"] and rows["d1"] == rows["d4"]
    rep = json.loads(report.read_text())
    q = rep["questions"]
    assert (q["records"], q["unique_prompts"], q["answered"], q["failed"]) == (5, 3, 5, 0)  # answered: records
    assert sum(q["finish_reasons"].values()) == 5
    workers = rep["workers"].values()
    assert sum(w["questions"] for w in workers) == 3
    assert sum(w["generated_tokens"] for w in workers) == rep["tokens"]["generated"] <= 3 * 12
    for key in ("ggbatch_version", "llama_cpp_python_version", "model", "layout", "generation", "tokens",
                "latency_s", "ttft_s", "mean_slot_occupancy", "timings_s", "memory"):
        assert key in rep, key
    assert len(rep["model"]["sha256_sampled"]) == 64
    assert rep["memory"]["plan"]["fits"] is True
    assert 0 < rep["mean_slot_occupancy"] <= 1
    assert rep["latency_s"]["p50"] <= rep["latency_s"]["p95"] <= rep["latency_s"]["max"]


def test_make_model_writes_a_model_that_answers(tmp_path, questions_file):
    model = tmp_path / "m.gguf"
    r = cli("make-model", "--shape", "demo", "--quant", "q8_0",
                str(model), timeout=120)
    assert r.returncode == 0, r.stderr
    assert model.read_bytes()[:4] == b"GGUF"
    r = ggbatch("--model", model, "--input", questions_file(3), "--output", tmp_path / "a.json", "--max-tokens", 4)
    assert r.returncode == 0, r.stderr
    bad = cli("make-model", "--shape", "nope", str(model), timeout=60)
    assert bad.returncode == 2 and "unknown shape 'nope'" in bad.stderr


@pytest.mark.slow
def test_bench_prints_the_batched_bench_table_and_the_runner_overhead(tmp_path, demo_model):
    r = cli("bench", "--model", demo_model, "--npp", "32", "--ntg", "8",
                "--npl", "1,4", "--repeat", "2", "--json", str(tmp_path / "b.json"),
                "--csv", str(tmp_path / "b.csv"), "--plot", str(tmp_path / "b.png"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "|       PP |       TG |        B |     N_KV |   T_PP s | S_PP t/s |" in r.stdout
    data = json.loads((tmp_path / "b.json").read_text())
    assert [(row["PP"], row["TG"], row["B"], row["N_KV"]) for row in data["raw"]] == [(32, 8, 1, 40), (32, 8, 4, 160)]
    assert all(row["S_TG t/s"] > 0 and row["T s"] > 0 for row in data["raw"])
    # like llama-batched-bench: TG generation steps of B tokens each, after the prompt step
    assert all(row["S_TG t/s"] * row["T_TG s"] == pytest.approx(row["B"] * row["TG"]) for row in data["raw"])
    assert (tmp_path / "b.png").read_bytes().startswith(b"\x89PNG")
    assert data["runner"][0]["B"] == 4 and data["runner"][0]["runner S t/s"] > 0
    assert (tmp_path / "b.csv").read_text().startswith("PP,TG,B,N_KV")
    bad = cli("bench", "--model", demo_model, "--npl", "0", timeout=60)
    assert bad.returncode == 2 and "--npl: expected integers >= 1" in bad.stderr


def test_bench_with_gpu_layers_and_where_its_steps_went(tmp_path, stories):
    # This machine's llama.cpp cannot offload: the layers stay on the CPU, the table is the same.
    r = cli("bench", "--model", stories, "--npp", "16", "--ntg", "4", "--npl", "2", "--gpu-layers", "all",
            "--no-runner", "--json", str(tmp_path / "b.json"), timeout=120)
    assert r.returncode == 0, r.stderr
    row = json.loads((tmp_path / "b.json").read_text())["raw"][0]
    split = row["decode s"] + row["pick s"] + row["python s"]
    assert row["decode s"] > 0 and 0 < split <= row["T s"] * 1.05
    bad = cli("bench", "--model", stories, "--npl", "256", timeout=60)
    assert bad.returncode == 2 and "--npl: at most 255 sequences per decode" in bad.stderr
    bad = cli("bench", "--model", stories, "--gpu-layers", "lots", timeout=60)
    assert bad.returncode == 2 and "--gpu-layers: must be an integer >= 0, all or auto" in bad.stderr


@pytest.mark.parametrize("flag", ["--json", "--csv"])
def test_bench_checks_its_tables_folder_before_it_runs(tmp_path, stories, flag):
    r = cli("bench", "--model", stories, "--npl", "1", flag, str(tmp_path / "nodir" / "b.out"), timeout=60)
    assert r.returncode == 2
    assert f"b.out: the folder of the bench table ({flag}), {tmp_path / 'nodir'}, does not exist" in r.stderr
    assert "PP" not in r.stdout  # no row measured: the check came first


@pytest.mark.parametrize(("flag", "role"), [("--json", "the bench table (--json)"),
                                           ("--csv", "the bench table (--csv)"), ("--plot", "the plot (--plot)")])
def test_bench_refuses_to_write_over_its_model(tmp_path, stories, flag, role):
    model = tmp_path / "m.gguf"
    model.write_bytes(Path(stories).read_bytes())
    r = cli("bench", "--model", model, "--npl", "1", flag, model, timeout=60)
    assert r.returncode == 2 and "PP" not in r.stdout  # refused before any row
    assert f"{role} and the model (--model) are the same file ({model}): ggbatch would overwrite the model; give " \
           "another path" in r.stderr
    assert model.read_bytes() == Path(stories).read_bytes()


def test_bench_plot_refuses_a_format_before_it_runs_and_leaves_no_half_picture(tmp_path, stories):
    # a format matplotlib does not know: refused before any row is measured
    r = cli("bench", "--model", stories, "--npl", "1", "--no-runner", "--plot", str(tmp_path / "b.pngg"), timeout=60)
    assert r.returncode == 2 and "PP" not in r.stdout
    assert f"{tmp_path / 'b.pngg'}: matplotlib cannot write .pngg files; give one of" in r.stderr
    # one it knows but cannot write here (.pgf without a TeX): refused before any row too (it came
    # after the whole benchmark), one line, and neither the table nor the plot is written
    no_tex = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    r = cli("bench", "--model", stories, "--npp", "8", "--ntg", "2", "--npl", "1", "--no-runner",
            "--plot", str(tmp_path / "b.pgf"), "--json", str(tmp_path / "b.json"), timeout=120, env=no_tex)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "PP" not in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines()[-1].startswith(f"ggbatch: error: {tmp_path / 'b.pgf'}: matplotlib cannot "
                                                        "write .pgf files here: 'xelatex' not found")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--workers", "--threads", "--repeat"])
def test_bench_counts_must_be_positive(stories, flag):
    r = cli("bench", "--model", stories, flag, "0", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"ggbatch bench: error: argument {flag}: expected an integer >= 1, got '0'")


def test_bench_runner_row_with_several_workers(tmp_path, demo_model):
    n_cores = len(os.sched_getaffinity(0))
    r = cli("bench", "--model", demo_model, "--npp", "16", "--ntg", "4",
                "--npl", "2", "--workers", str(n_cores), "--json", str(tmp_path / "b.json"), timeout=120)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads((tmp_path / "b.json").read_text())["runner"]
    assert row["workers"] == n_cores and row["runner S t/s"] > 0
    assert f"{n_cores} pinned worker process{'es' if n_cores > 1 else ''} × 1 thread)" in r.stdout
    bad = cli("bench", "--model", demo_model,
                  "--workers", str(n_cores + 1), timeout=60)
    assert bad.returncode == 2 and f"{n_cores + 1} workers need at least {n_cores + 1} cores" in bad.stderr


@pytest.mark.slow
def test_tune_picks_the_fastest_layout_and_auto_uses_it(tmp_path, demo_q4_model, questions_file):
    r = subprocess.run(ggbatch_command("tune", "--model", demo_q4_model, "--input", questions_file(8),
                                       "--questions", "8", "--max-tokens", "8", "--slots", "2,4"),
                       cwd=ROOT, capture_output=True, text=True, timeout=200,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    # says how long first, in seconds when under a minute (it said "about 0 min")
    assert re.search(r"^trying .*: about \d+ s \(a rough guess\)$", r.stdout.splitlines()[0]), r.stdout
    # a layout's counts in the singular where they are one (it said "1 workers × 1 threads")
    assert re.search(r"^  1 worker  × ", r.stdout, re.M) and not re.search(r"\b1 (workers|threads|slots)\b", r.stdout)
    cache = json.loads((tmp_path / "cache" / "ggbatch" / "layouts.json").read_text())
    (model_entry,) = cache.values()
    (bucket, entry), = model_entry["contexts"].items()
    (n_ctx_seq,) = {t["n_ctx_per_sequence"] for t in entry["trials"]}  # one sample: one context
    assert int(bucket) == context_bucket(n_ctx_seq)  # saved under the sample's context bucket
    best = max(entry["trials"], key=lambda t: t["generated_tok_s"])
    assert entry["choice"] == {k: best[k] for k in ("workers", "threads", "slots", "repack")}  # the fastest
    # 2 slot counts × weights repacked or not (plain only where this CPU refuses the repacked
    # kernels) × each split of the cores into equal workers
    weights = {True, False} if repack_runs() else {False}
    assert len(entry["trials"]) == 2 * len(weights) * sum(1 for w in range(1, len(os.sched_getaffinity(0)) + 1)
                                                          if len(os.sched_getaffinity(0)) % w == 0)
    assert {t["repack"] for t in entry["trials"]} == weights
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    r = subprocess.run(ggbatch_command("run", "--model", demo_q4_model, "--input", questions_file(8),
                                       "--output", str(out), "--max-tokens", "4", "--report", str(report)),
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    layout = json.loads(report.read_text())["layout"]
    assert (layout["workers"], layout["threads_per_worker"]) == (entry["choice"]["workers"], entry["choice"]["threads"])
    assert layout["slots_per_worker"] <= entry["choice"]["slots"]
    assert (layout["repack_weights"], layout["repack_reason"]) == (entry["choice"]["repack"], "ggbatch tune")
    tuned = tmp_path / "cache" / "ggbatch" / "layouts.json"
    assert f"layout from ggbatch tune ({tuned}, tuned for <= {bucket}" in r.stderr


def test_repack_setting_reaches_llama_cpp(tmp_path, questions_file):
    # A Q4_K model (rows of 256: what llama.cpp's repacked kernels take). llama.cpp's own log,
    # let through by GGBATCH_LLAMA_LOG, says whether it made a CPU_REPACK buffer.
    from ggbatch.runner.model.make import modelgen as mg
    from ggbatch.runner.plan.repack import cpu_flags

    if "avx2" not in cpu_flags():
        pytest.skip("llama.cpp repacks Q4_K weights only on x86 CPUs with AVX2 (this one has none)")

    shape = mg.ModelShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=512)
    src = mg.write_random_llama_gguf(tmp_path / "f16.gguf", shape, mg.build_demo_vocab(), seed=0)
    model = mg.quantize(src, tmp_path / "q4.gguf", "q4_k_m")
    if not repack_runs():  # this CPU refuses them: asked for, they are refused with the probe's reason
        refused = ggbatch("--model", str(model), "--input", questions_file(4), "--output", tmp_path / "a.json",
                          "--repack", "true")
        assert refused.returncode == 2 and refused.stderr.strip() == (
            f"ggbatch: error: model.repack: true: {repack_refusal()}; leave it auto or false")
    for repack in ("true", "false") if repack_runs() else ("false",):
        report = tmp_path / f"r-{repack}.json"
        r = subprocess.run(ggbatch_command("run", "--model", str(model), "--input", questions_file(4),
                                           "--output", str(tmp_path / f"a-{repack}.json"), "--max-tokens", "4",
                                           "--repack", repack, "--report", str(report)),
                           cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "GGBATCH_LLAMA_LOG": "1"})
        assert r.returncode == 0, r.stderr[-2000:]
        assert ("CPU_REPACK model buffer" in r.stderr) == (repack == "true")
        layout = json.loads(report.read_text())["layout"]
        assert (layout["repack_weights"], layout["repack_reason"]) == (repack == "true", "job")
        assert f"weights {'repacked' if repack == 'true' else 'not repacked'} (job)" in r.stdout


def test_auto_repack_follows_the_cpu_and_the_expected_slots(tmp_path, demo_q4_model, questions_file):
    from ggbatch.runner.plan.repack import cpu_flags, repack_weights

    report = tmp_path / "r.json"
    r = ggbatch("--model", demo_q4_model, "--input", questions_file(20), "--output", tmp_path / "a.json",
                "--max-tokens", 2,
                "--workers", 1, "--report", report)
    assert r.returncode == 0, r.stderr
    layout = json.loads(report.read_text())["layout"]
    assert layout["slots_per_worker"] == 20  # the estimate made before tokenizing was right
    assert (layout["repack_weights"], layout["repack_reason"]) == repack_weights(None, None, cpu_flags(), 20,
                                                                                 refused=repack_refusal())


@pytest.mark.parametrize("flag,given", [("7", 7), ("all", "all")])
def test_gpu_layers_reach_llama_cpp_and_a_cpu_only_build_warns_once(tmp_path, demo_model, questions_file, flag, given):
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python build can offload: the CPU-only warning does not apply")
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    r = ggbatch("--model", demo_model, "--input", questions_file(6), "--output", out, "--max-tokens", 4,
                "--gpu-layers", flag, "--devices", "0", "--report", report)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("this llama-cpp-python build has no GPU offload (llama_supports_gpu_offload() is "
                          "false), so every layer stays on the CPU") == 1
    rep = json.loads(report.read_text())
    layout, worker = rep["layout"], rep["workers"]["0"]
    assert (layout["n_gpu_layers"], layout["devices"], layout["gpu_offload"]) == (given, [0], False)
    # What the worker put in llama.cpp's model params, and what llama.cpp did with it.
    assert (worker["n_gpu_layers"], worker["gpu_layers"], worker["device"]) == (given, 0, 0)
    # Every layer stays on the CPU: the CPU layout's threads, and the whole model in the RAM plan.
    assert layout["threads_per_worker"] == len(os.sched_getaffinity(0)) == worker["llama_n_threads"]
    assert rep["memory"]["plan"]["cpu_layer_share"] == 1.0
    assert "no GPU offload in this llama.cpp build" in rep["memory"]["plan"]["vram"]
    assert f"{given} layers asked for the GPU on GPU 0 (none offloaded" in r.stdout


@pytest.mark.parametrize("name, text", [("q.jsonl", '{"questionID": "1", "Prompt Text": "Once upon"}\n'),
                                        ("q.csv", "questionID,Prompt Text\n1,Once upon\n")])
def test_a_template_reading_a_field_jinja_cannot_name_needs_no_question_field(tmp_path, demo_model, name, text):
    questions = tmp_path / name
    questions.write_text(text)
    run = ("--model", demo_model, "--input", questions, "--output", tmp_path / "a.json", "--max-tokens", 4, "-q")
    r = ggbatch(*run, "--template", '{{ record["Prompt Text"] }}')
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "a.json").read_text())[0]["answer"]
    r = ggbatch(*run, "--template", '{{ record["Prompt Txt"] }}', "--fresh")  # a field no record has
    assert r.returncode == 2 and "has no field 'Prompt Txt' that prompt.template uses" in r.stderr, r.stderr
