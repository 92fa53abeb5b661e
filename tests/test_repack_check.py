"""Whether this machine's llama.cpp runs repacked weights, asked once by a probe process
(runner/plan/repack_check.py, workers/llama/repack_probe.py): on a CPU that lists an instruction
set it refuses (an x86 VM listing AMX), every worker of a quantized model died with SIGILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ggbatch.runner.files.paths import ggbatch_cache
from ggbatch.runner.plan.repack import cpu_flags
from ggbatch.runner.plan.repack_check import VERDICTS, build_key, repacked_weights_run
from helpers import ggbatch


@pytest.mark.model
@pytest.mark.timeout(300)
def test_the_verdict_is_the_probe_process_s_own_and_is_kept_per_build_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    runs, why = repacked_weights_run(cpu_flags())
    models = sorted((ggbatch_cache() / "repack-probe").glob("probe-*.gguf"))
    assert [m.name for m in models] == ["probe-q4_0.gguf", "probe-q4_k_m.gguf", "probe-q8_0.gguf"]
    # the same question asked of the probe directly: a death by SIGILL is a refusal
    done = subprocess.run([sys.executable, "-m", "ggbatch.workers.llama.repack_probe", *map(str, models)],
                          capture_output=True, timeout=120)
    assert runs is (done.returncode == 0), done.stderr[-2000:]
    assert (why == "") is runs
    kept = json.loads((ggbatch_cache() / VERDICTS).read_text())
    assert kept == {build_key(cpu_flags()): {"runs": runs, "why": why}}
    assert build_key(cpu_flags() | {"another_flag"}) != build_key(cpu_flags())  # another CPU asks again


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_quantized_model_answers_with_the_default_weights_layout(k_quant_model, questions_file, tmp_path):
    # Q4_K_M and Q8_0 are taken by llama.cpp's repacked layouts (CPU_REPACK, AMX): where this CPU
    # refuses them, the default is plain weights, and the job answers rather than dying with SIGILL.
    out, report = tmp_path / "a.jsonl", tmp_path / "r.json"
    done = ggbatch("run", "--model", k_quant_model, "--input", questions_file(4), "--output", out,
                   "--max-tokens", 4, "--progress", "off", "--report", report)
    assert done.returncode == 0, done.stderr
    layout = json.loads(report.read_text())["layout"]
    runs, why = repacked_weights_run(cpu_flags())
    assert layout["repack_weights"] is runs or layout["repack_weights"] is False
    if not runs:
        assert why in done.stdout


def test_a_probe_that_cannot_run_keeps_the_weights_plain(tmp_path, monkeypatch):
    # No disk for the probe's models: unknown is not yes. On a CPU whose repacked kernels stop it
    # (an AMX VM), a yes here killed every worker of a Q8 model with SIGILL.
    (tmp_path / "a_file").write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file"))
    runs, why = repacked_weights_run(cpu_flags())
    assert runs is False
    assert why.startswith("no probe could check that llama.cpp's repacked kernels run on this CPU (its models "
                          "could not be written: ")


def _kill_the_probe(stop: threading.Event) -> None:
    """SIGKILL the repack probe process as it appears, as the OOM killer would."""
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if pid.isdigit() and b"ggbatch.workers.llama.repack_probe" in cmd:
                os.kill(int(pid), signal.SIGKILL)
                return
        time.sleep(0.01)


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_probe_killed_from_outside_is_no_verdict_and_is_not_kept(tmp_path, monkeypatch):
    # One kill -9 of the probe (the OOM killer) was kept as "this CPU refuses repacked kernels
    # (SIGKILL)": every later run kept its weights plain and `repack: true` was refused.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    stop = threading.Event()
    killer = threading.Thread(target=_kill_the_probe, args=(stop,), daemon=True)
    killer.start()
    try:
        runs, why = repacked_weights_run(cpu_flags())
    finally:
        stop.set()
        killer.join(10)
    assert runs is False  # unknown for this run is not yes
    assert why == ("no probe could check that llama.cpp's repacked kernels run on this CPU (it was stopped "
                   "by SIGKILL)")
    assert not (ggbatch_cache() / VERDICTS).exists()
