"""W1 / W2 / W4: ggbatch against llama-server with parallel slots, on the same model, same prompts,
exactly 64 generated tokens per question, in the same sitting.

    python bench/compare_server.py --server PATH/llama-server [--model M.gguf] [--workloads W1,W2]

W1: the first 32 GSM8K questions, system prompt "Answer the question concisely."
W2: the system prompt also holds the first 8 GSM8K questions with their answers as examples,
    and the questions are records 9-40 (a long shared prefix).
W4: as W1 with the first 256 questions: slots are refilled many times over (continuous batching).
LSAT: the first 64 LSAT-RC questions (../shared/data/lsat-rc: several questions on each passage),
    32 generated tokens: prompt processing dominates, and ggbatch's prefix cache computes each
    passage about once per worker; LSAT-shuffled: the same questions in a shuffled file.

ggbatch is timed as a whole command (start-up, model load, tokenizing, answering, writing). The
server is started and loaded first and timed from the first request to the last answer, with 16
concurrent clients and its prompt cache on: the comparison favours the server.

llama-server is not part of ggbatch; build it from the llama.cpp sources that ship inside the
pinned llama-cpp-python source package (same llama.cpp as ggbatch uses):
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build -j --target llama-server llama-batched-bench
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from engine_bench import GSM8K, SHARED, bench_model  # noqa: E402
from plain_weights import server_flags  # noqa: E402

SYSTEM = "Answer the question concisely."
LSAT = SHARED / "data" / "lsat-rc" / "questions.jsonl"
TOKENS = 64  # generated per question in W1, W2 and W4


@dataclass(frozen=True)
class Workload:
    system: str
    records: list[dict[str, Any]]
    tokens: int = TOKENS  # generated per question, exactly (ignore_eos)
    ctx_per_slot: int = 1024  # llama-server's context per slot (-c = 16 × this)


def workload(name: str) -> Workload:
    if name.startswith("LSAT"):
        with open(LSAT, encoding="utf-8") as f:
            records = [json.loads(line) for _, line in zip(range(64), f)]
        if name == "LSAT-shuffled":
            random.Random(0).shuffle(records)
        elif name != "LSAT":
            raise SystemExit(f"unknown workload {name!r}")
        return Workload("Answer with the letter of the correct choice.", records, tokens=32, ctx_per_slot=2048)
    with open(GSM8K, encoding="utf-8") as f:
        records = [json.loads(line) for _, line in zip(range(256), f)]
    if name == "W1":
        return Workload(SYSTEM, records[:32])
    if name == "W4":
        return Workload(SYSTEM, records)
    if name != "W2":
        raise SystemExit(f"unknown workload {name!r}: W1, W2, W4, LSAT or LSAT-shuffled")
    examples = "\n\n".join(f"Question: {r['question']}\nAnswer: {r['answer']}" for r in records[:8])
    return Workload(f"{SYSTEM}\n\nExamples:\n\n{examples}", records[8:40])


@dataclass(frozen=True)
class GgbatchRun:
    wall: float  # seconds, the whole command
    report: dict[str, Any]  # its --report
    stderr: bytes  # its log


def gpu_flags(gpu_layers: str, flag: str = "--gpu-layers") -> list[str]:
    """A bench's --gpu-layers N|all as ggbatch's flag (or llama-server's -ngl, which reads `all`
    alike); none for 0, the default."""
    return [flag, gpu_layers] if gpu_layers != "0" else []


def time_ggbatch(model: str, work: Workload, extra: list[str]) -> GgbatchRun:
    """One whole `ggbatch run` of the workload (exactly work.tokens generated per question), timed;
    `extra`: more flags. contention_bench.py runs ggbatch through here too."""
    system, records, tokens = work.system, work.records, work.tokens
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "q.jsonl"
        q.write_text("".join(json.dumps({"questionID": r["questionID"], "question": r["question"]}) + "\n"
                             for r in records))
        cmd = [sys.executable, "-m", "ggbatch", "run", "--model", model, "--input", str(q),
               "--output", str(Path(tmp) / "a.json"), "--system", system, "--max-tokens", str(tokens),
               "--ignore-eos", "--report", str(Path(tmp) / "r.json"), "--progress", "log", *extra]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        report = json.loads((Path(tmp) / "r.json").read_text())
        assert report["tokens"]["generated"] == tokens * len(records), report["tokens"]
        return GgbatchRun(wall, report, done.stderr)


def run_ggbatch(model: str, work: Workload, extra: list[str]) -> float:
    """time_ggbatch's wall time, with a line on the layout and the prefix cache it had."""
    run = time_ggbatch(model, work, extra)
    report = run.report
    lay, cache = report["layout"], report["prefix_cache"]
    print(f"    ggbatch layout: {lay['workers']}w × {lay['threads_per_worker']}t × "
          f"{lay['slots_per_worker']} slots, prefix {lay['shared_prefix_tokens']} tokens, weights "
          f"{'repacked' if lay['repack_weights'] else 'not repacked'} ({lay['repack_reason']}), "
          f"prepare {report['timings_s']['prepare_s']:.2f} s, first ready "
          f"{report['timings_s']['first_worker_ready_s']:.2f} s, prompt tokens computed "
          f"{cache['prompt_tokens_computed']} of {cache['prompt_tokens']}", flush=True)
    return run.wall


def run_server(server: str, model: str, work: Workload, extra: list[str], port: int = 18080, parallel: int = 16,
               n: int = 1, temperature: float = 0.0) -> float:
    """Seconds from the first request to the last answer, `parallel` slots and as many clients, each
    request asking for n completions (llama-server's n_cmpl: one prompt, n sequences)."""
    system, records, tokens = work.system, work.records, work.tokens
    threads = str(len(os.sched_getaffinity(0)))
    proc = subprocess.Popen([server, "-m", model, "-np", str(parallel), "-c", str(parallel * work.ctx_per_slot),
                             "-t", threads,
                             "-tb", threads, "--host", "127.0.0.1", "--port", str(port), *server_flags(), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("llama-server did not start")
            time.sleep(0.3)

        def ask(r: dict[str, Any]) -> int:
            body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": r["question"]}],
                    "max_tokens": tokens, "temperature": temperature, "ignore_eos": True, "cache_prompt": True,
                    "n": n}
            req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as resp:
                answer = json.load(resp)
            # llama-server's usage counts one completion's tokens whatever n is: each of the n
            # choices holds exactly `tokens` (EOS ignored)
            return int(answer["usage"]["completion_tokens"]) * len(answer["choices"])

        t0 = time.perf_counter()
        with ThreadPoolExecutor(parallel) as pool:
            generated = sum(pool.map(ask, records))
        wall = time.perf_counter() - t0
        assert generated == n * tokens * len(records), generated
        return wall
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model")
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--ggbatch-args", default="", help="extra ggbatch flags, e.g. '--slots 16'")
    ap.add_argument("--server-args", default="",
                    help="extra llama-server flags, e.g. '--no-repack' for the weight layout ggbatch "
                         "picks on AVX-512 CPUs")
    args = ap.parse_args()
    model = args.model or bench_model()
    print(f"model {model}")
    print(f"{'workload':>8} {'tool':>12} {'wall s':>8} {'gen tok/s':>9}")
    walls: dict[str, list[tuple[float, float]]] = {}
    for name in args.workloads.split(","):
        work = workload(name)
        n_tokens = work.tokens * len(work.records)
        for _ in range(args.repeat):
            s = run_server(args.server, model, work, args.server_args.split())
            print(f"{name:>8} {'llama-server':>12} {s:>8.1f} {n_tokens / s:>9.1f}", flush=True)
            g = run_ggbatch(model, work, args.ggbatch_args.split())
            print(f"{name:>8} {'ggbatch':>12} {g:>8.1f} {n_tokens / g:>9.1f}   ({s / g:.2f}× the server)",
                  flush=True)
            walls.setdefault(name, []).append((s, g))
    for name, pairs in walls.items():
        s, g = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        print(f"{name}: median of {len(pairs)}: llama-server {s:.1f} s, ggbatch {g:.1f} s, "
              f"median ratio {ratio:.2f}× the server's throughput")


if __name__ == "__main__":
    main()
