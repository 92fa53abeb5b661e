"""Issue 16's big file: N questions built from every question set in ../shared/data (cycled, ids
made unique), answered by stories260K with --max-tokens 1 (or, with --fake, tokenized by stories260K and
answered by tests/fake_engine.py: the coordinator's path exactly, at the speed of the coordinator
rather than of the model: stories260K answers ~40 questions/s on this machine). Measures the
coordinator's peak RSS (the report's memory.coordinator_peak_rss_mib), the time from start to
the first answer in the journal, and, with --kill-at F, a kill -9 of the coordinator once a
fraction F of the questions is answered, then the rerun: its time to its first new answer and
whether its answers file equals a run in one go (--compare, which answers the whole file once
more). --stop SIGNAL@F (repeatable, in order) stops it several times: SIGINT at 35%, then kill -9
at 70%, then the rerun, as a user whose job was interrupted twice does.

    python bench/big_file_bench.py --questions 1000000 [--fake] [--kill-at 0.5] [--compare] [--workers 2]
    python bench/big_file_bench.py --questions 100000 --fake --stop INT@0.35 --stop KILL@0.7 --compare
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
MODEL = ROOT.parent / "shared" / "models" / "stories260K.gguf"


def build(path: Path, n: int) -> int:
    """n questions from the four sets, cycled, each made unique by its number (a file of a few
    thousand prompts repeated would be answered a few thousand times: identical prompts are
    answered once); returns the file's bytes."""
    sources = []
    for name in ("gsm8k", "truthfulqa", "mmlu", "lsat-rc"):
        with open(DATA / name / "questions.jsonl", encoding="utf-8") as f:
            sources += [(name, json.loads(line)) for line in f if line.strip()]
    with open(path, "w", encoding="utf-8") as f:
        for i, (name, rec) in zip(range(n), itertools.cycle(sources)):
            record = {"questionID": f"{name}-{i}-{rec['questionID']}", "question": f"{rec['question']} (item {i})"}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path.stat().st_size


class JournalLines:
    """Answers in a journal, counted from where the last count stopped: counting the whole file
    every 50 ms would take a core from the run it measures."""

    def __init__(self, path: Path) -> None:
        self.path, self.at, self.lines = path, 0, -1  # the header is not an answer

    def count(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.at)
                data = f.read()
        except FileNotFoundError:
            return 0
        complete = data.rfind(b"\n") + 1
        self.lines += data.count(b"\n", 0, complete)
        self.at += complete
        return max(self.lines, 0)


def run(questions: Path, out: Path, args: argparse.Namespace, kill_at: int = 0, first_after: int = 0,
        sig: int = signal.SIGKILL) -> dict[str, Any]:
    """One run of the CLI; kill_at: send `sig` once the journal holds that many answers (and wait
    for the run to end). Returns the seconds to the first answer beyond first_after, the wall time
    and the report."""
    report = out.with_suffix(".report.json")
    cli = ["run", "--model", str(MODEL), "--input", str(questions), "--output", str(out), "--max-tokens", "1",
           "--workers", str(args.workers), "--progress", "log", "--report", str(report)]
    cmd = [sys.executable, __file__, "--one", json.dumps(cli)] if args.fake else [sys.executable, "-m", "ggbatch", *cli]
    journal = JournalLines(Path(f"{out}.journal.jsonl"))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while proc.poll() is None:
        answered = journal.count() if first is None or kill_at else 0
        if first is None and answered > first_after:
            first = time.perf_counter() - t0
        if kill_at and answered >= kill_at:
            os.kill(proc.pid, sig)  # on a kill -9 the workers die with their parent
            proc.wait()
            return {"first_answer_s": first, "killed_at": answered, "wall_s": time.perf_counter() - t0,
                    "signal": signal.Signals(sig).name, "exit": proc.returncode}
        time.sleep(0.05 if first is None else 1.0)
    wall = time.perf_counter() - t0
    data = json.loads(report.read_text()) if report.exists() else {}
    return {"first_answer_s": first, "wall_s": wall, "exit": proc.returncode,
            "coordinator_peak_rss_mib": data.get("memory", {}).get("coordinator_peak_rss_mib"),
            "answered": data.get("questions", {}).get("answered"),
            "from_journal": data.get("questions", {}).get("from_journal")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kill-at", type=float, default=0.0, help="fraction answered at which to kill -9 (0: no kill)")
    ap.add_argument("--stop", action="append", default=[], metavar="SIGNAL@F",
                    help="send SIGNAL (INT, TERM, KILL) once a fraction F is answered; repeatable, in order")
    ap.add_argument("--compare", action="store_true", help="also answer the file in one go and compare")
    ap.add_argument("--dir", help="where to put the files (default: a temporary directory)")
    ap.add_argument("--fake", action="store_true", help="answer with the fake engine (tests/fake_engine.py)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: the CLI's arguments, run with the fake engine
    args = ap.parse_args()
    if args.one:
        sys.path.insert(0, str(ROOT / "tests"))
        from fake_engine import Fake
        from ggbatch import build_config
        from ggbatch.runner.cli import _flag_layer, build_parser
        from ggbatch.runner.job import run_job
        from ggbatch.runner.watch.progress import setup_logging

        setup_logging(False, False)
        cli = build_parser().parse_args(json.loads(args.one))
        from ggbatch import GgbatchError

        try:
            run_job(build_config([("command line", _flag_layer(cli))]), engine_factory=Fake(), progress="log")
        except GgbatchError as exc:  # a stop by signal: its exit code, as the command line's
            sys.exit(exc.exit_code)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        questions = Path(tmp) / "questions.jsonl"
        size = build(questions, args.questions)
        print(f"{args.questions} questions, {size / 2**20:.0f} MiB", flush=True)
        out = Path(tmp) / "answers.jsonl"
        stops = [stop.split("@") for stop in args.stop] + ([["KILL", str(args.kill_at)]] if args.kill_at else [])
        if stops:
            killed = {"killed_at": 0}
            for name, fraction in stops:
                killed = run(questions, out, args, kill_at=int(float(fraction) * args.questions),
                             first_after=killed["killed_at"], sig=signal.Signals[f"SIG{name.upper()}"])
                print(f"stopped: {json.dumps(killed)}", flush=True)
                if "killed_at" not in killed:
                    return
            resumed = run(questions, out, args, first_after=killed["killed_at"])
            print(f"resumed: {json.dumps(resumed)}", flush=True)
        else:
            print(f"run: {json.dumps(run(questions, out, args))}", flush=True)
        if args.compare:
            whole = Path(tmp) / "whole.jsonl"
            print(f"in one go: {json.dumps(run(questions, whole, args))}", flush=True)
            same = whole.read_bytes() == out.read_bytes()
            print(f"answers files identical: {same}", flush=True)


if __name__ == "__main__":
    main()
