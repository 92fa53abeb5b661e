"""lm-eval through ggbatch's backend against the issue's peers, on the same local tasks, in one
sitting, the two sides alternated; medians.

    HF_DATASETS_OFFLINE=1 python bench/lmeval_compare.py [--model M.gguf] [--task mmlu|gsm8k|both]
        [--mmlu 100] [--gsm8k 32] [--repeat 2] [--gpu-layers all]

- mmlu: 5-shot MMLU validation questions (../shared/data/mmlu), lm-eval's `multiple_choice` with
  the letters as continuations, the five shots drawn in lm-eval's own order for each question
  from five fixed records (as lm-eval's MMLU draws from a subject's dev split). Peer: llama-cpp-python
  computing each of lm-eval's contexts once (bench/llamacpp_lm.py). Compared: wall time (model
  load included on both sides), the picks, the largest log-likelihood difference, and the prompt
  tokens computed against the tokens in the contexts and in their prefix tree.
- gsm8k: 5-shot GSM8K (../shared/data/gsm8k), greedy `generate_until`, 128 tokens. Peer: lm-eval's
  `local-completions` on llama-cpp-python's server (`pip install 'llama-cpp-python[server]'
  tenacity aiohttp`), started and loaded before its clock starts. Compared: wall time, the score,
  and how many answers are the same text.

The model defaults to the benchmark model (bench/engine_bench.py builds it when absent). Threads:
every core on both sides. `--gpu-layers N|all` puts that many layers on the GPU on every side
(ggbatch's `model.n_gpu_layers`, llama-cpp-python's `n_gpu_layers`). lm-eval runs the local
tasks alone on both sides: its index of the few thousand tasks it ships (about 20 s of YAML
parsing on this machine, the same for every backend) is skipped, so the times are the backends'
and lm-eval's work on these tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
DATA = ROOT.parent / "shared" / "data"
SHOTS = 5

# Both tasks read the records write_task puts beside them: the test split, and the shots' split.
LOCAL_SPLITS = """dataset_path: json
dataset_kwargs:
  data_files: {{test: "{test}", fewshot: "{fewshot}"}}
test_split: test
fewshot_split: fewshot
"""

MMLU_TASK = "task: mmlu_val_local\n" + LOCAL_SPLITS + """output_type: multiple_choice
description: "The following are multiple choice questions (with answers).\\n\\n"
doc_to_text: "{{{{question.strip()}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: "{{{{['A', 'B', 'C', 'D'].index(answer)}}}}"
metric_list:
  - metric: acc
"""

GSM8K_TASK = "task: gsm8k_local\n" + LOCAL_SPLITS + """output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["Question:", "\\n\\n"]
  max_gen_toks: 128
  do_sample: false
metric_list:
  - metric: exact_match
"""


def write_task(folder: Path, name: str, template: str, source: Path, n: int) -> None:
    """The task YAML over the source's first n records, its shots the source's last five."""
    lines = source.read_text(encoding="utf-8").splitlines()
    (folder / f"{name}-test.jsonl").write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    (folder / f"{name}-fewshot.jsonl").write_text("\n".join(lines[-SHOTS:]) + "\n", encoding="utf-8")
    (folder / f"{name}.yaml").write_text(template.format(test=folder / f"{name}-test.jsonl",
                                                         fewshot=folder / f"{name}-fewshot.jsonl"))


def evaluate(lm: Any, task: str, folder: Path, **kwargs: Any) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(folder), include_defaults=False)
    results: dict[str, Any] = lm_eval.simple_evaluate(model=lm, tasks=[task], num_fewshot=SHOTS, log_samples=True,
                                                      task_manager=tasks, **kwargs)
    return results


def warm_up(task: str, folder: Path) -> None:
    """One untimed run of the task with a model that answers at once, so that lm-eval's own
    first-run costs in this process (its imports, the task's dataset built from the JSON files)
    fall on neither side: about 5 s, which on a GPU is the size of a whole side."""
    from lm_eval.api.model import LM

    class Instant(LM):  # type: ignore[misc]  # lm-eval ships no type information
        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
            return [(0.0, False)] * len(requests)

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            return [0.0] * len(requests)

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            return [""] * len(requests)

    evaluate(Instant(), task, folder)


def ggbatch_side(model: str, task: str, folder: Path,
                 settings: dict[str, Any]) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """(seconds from the pool's start to its close, lm-eval's output, the pool's counters). The
    pool starts while lm-eval builds the task (GgbatchLM)."""
    from ggbatch.lm_eval import GgbatchLM

    t0 = time.perf_counter()
    lm = GgbatchLM(model=model, **settings)
    calls = timed_calls(lm)
    try:
        out, evaluating = timed_evaluate(lm, task, folder)
        stats = lm.pool.stats()
    finally:
        lm.pool.close()
    ended = time.perf_counter()
    print(f"{task} ggbatch: {ended - t0:.2f} s from the pool's start, while lm-eval builds the task, to its "
          "close", flush=True)
    workers = "; ".join(f"worker {wid}: load {w['load_s']} s, engine steps {w['engine_step_s']} s (llama_decode "
                        f"{w['engine_decode_s']}, picking tokens {w['engine_sample_s']})"
                        for wid, w in stats["workers"].items())
    print(f"{task} ggbatch: {where_time_went(calls, t0, evaluating)}; {workers}", flush=True)
    return ended - t0, out, stats


def timed_evaluate(lm: Any, task: str, folder: Path, **kwargs: Any) -> tuple[dict[str, Any], float]:
    """(lm-eval's output, how long simple_evaluate took)."""
    start = time.perf_counter()
    out = evaluate(lm, task, folder, **kwargs)
    return out, time.perf_counter() - start


def where_time_went(calls: list[tuple[str, float, float]], t0: float, evaluating: float) -> str:
    """Each of lm-eval's calls on the model (when, how long), and lm-eval's own time around them:
    simple_evaluate's time less the calls'. That part is the same work whatever the backend (the
    task's requests built from its templates, the metrics), so no backend makes a side faster than
    its whole time divided by it."""
    said = ", ".join(f"{name} from {start - t0:.2f} s for {took:.2f} s" for name, start, took in calls)
    own = evaluating - sum(took for _, _, took in calls)
    return f"lm-eval's calls: {said}; lm-eval's own time {own:.2f} s of simple_evaluate's {evaluating:.2f} s"


def timed_calls(lm: Any) -> list[tuple[str, float, float]]:
    """(method, when it was called, how long it took) of each of lm-eval's calls on `lm`, as they
    end: where a side's time goes beside the model's work."""
    calls: list[tuple[str, float, float]] = []

    def timing(name: str) -> Callable[..., Any]:
        method = getattr(lm, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                calls.append((name, start, time.perf_counter() - start))
        return timed

    for name in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
        setattr(lm, name, timing(name))
    return calls


def llamacpp_side(model: str, folder: Path, gpu_layers: int, in_child: bool) -> tuple[float, dict[str, Any], int]:
    """(seconds from the model's load, lm-eval's output, prompt tokens computed)."""
    from llamacpp_lm import LlamaCppOnceLM

    t0 = time.perf_counter()
    lm = LlamaCppOnceLM(model, n_threads=os.cpu_count(), n_gpu_layers=gpu_layers, in_child=in_child)
    calls = timed_calls(lm)
    try:
        out, evaluating = timed_evaluate(lm, "mmlu_val_local", folder)
        took = time.perf_counter() - t0
        print(f"mmlu_val_local peer: {took:.2f} s from the model's load; {where_time_went(calls, t0, evaluating)}",
              flush=True)
        return took, out, lm.tokens_computed
    finally:
        lm.close()


def server_side(model: str, folder: Path, gpu_layers: int, port: int = 18111) -> tuple[float, dict[str, Any]]:
    """(seconds of lm-eval's local-completions run against the loaded server, lm-eval's output)."""
    import lm_eval.models.openai_completions  # noqa: F401  (registers local-completions)
    from lm_eval.api.registry import get_model

    # The server's weights as ggbatch's plan has them here (bench/plain_weights.py).
    serve = ("import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); import plain_weights; "
             "plain_weights.follow_plan(); runpy.run_module('llama_cpp.server', run_name='__main__')")
    # its stderr kept for the error should it not start (a missing `llama-cpp-python[server]`)
    log = tempfile.TemporaryFile()
    server = subprocess.Popen([sys.executable, "-c", serve, str(ROOT / "bench"), "--model", model, "--n_ctx", "2048",
                               "--n_threads", str(os.cpu_count()), "--n_gpu_layers", str(gpu_layers),
                               "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", server, log)
        args = {"model": "bench", "base_url": f"http://127.0.0.1:{port}/v1/completions", "num_concurrent": 1,
                "tokenized_requests": False, "tokenizer_backend": None, "max_retries": 1, "timeout": 3600}
        t0 = time.perf_counter()
        # The model made here as simple_evaluate would make it from its name, so its calls are timed.
        lm = get_model("local-completions").create_from_arg_obj(args, {"batch_size": None, "max_batch_size": None,
                                                                      "device": None})
        calls = timed_calls(lm)
        out, evaluating = timed_evaluate(lm, "gsm8k_local", folder)
        took = time.perf_counter() - t0
        print(f"gsm8k_local peer: {took:.2f} s; {where_time_went(calls, t0, evaluating)}", flush=True)
        return took, out
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def wait_for(url: str, process: subprocess.Popen[Any], log: Any, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            said = log.read().decode("utf-8", "replace").strip().splitlines()[-3:]
            raise RuntimeError(f"llama-cpp-python's server exited with {process.returncode}: " + " | ".join(said))
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"llama-cpp-python's server did not answer {url} in {limit_s:.0f} s")


def samples(out: dict[str, Any], task: str) -> dict[int, Any]:
    return {s["doc_id"]: s for s in out["samples"][task]}


def compare_mmlu(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    a, b = samples(ours, "mmlu_val_local"), samples(theirs, "mmlu_val_local")
    same, worst = 0, 0.0
    for doc, s in a.items():
        mine = [float(r[0][0]) for r in s["resps"]]
        peer = [float(r[0][0]) for r in b[doc]["resps"]]
        same += mine.index(max(mine)) == peer.index(max(peer))
        worst = max(worst, max(abs(x - y) for x, y in zip(mine, peer)))
    acc = ours["results"]["mmlu_val_local"]["acc,none"], theirs["results"]["mmlu_val_local"]["acc,none"]
    return (f"same pick on {same} of {len(a)} questions; acc {acc[0]:.3f} / {acc[1]:.3f}; "
            f"largest log-likelihood difference {worst:.2e} nats")


def compare_gsm8k(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    a, b = samples(ours, "gsm8k_local"), samples(theirs, "gsm8k_local")
    same = sum(a[d]["resps"][0][0] == b[d]["resps"][0][0] for d in a)
    for d in sorted(a)[:2]:
        print(f"gsm8k doc {d}: ggbatch {a[d]['resps'][0][0][:80]!r}\n{'':>13}peer {b[d]['resps'][0][0][:80]!r}")
    em = ours["results"]["gsm8k_local"]["exact_match,none"], theirs["results"]["gsm8k_local"]["exact_match,none"]
    return f"same text on {same} of {len(a)} answers; exact_match {em[0]:.3f} / {em[1]:.3f}"


def prefix_tree_tokens(contexts: list[list[int]]) -> int:
    """Tokens a computation that shares every common prefix would compute: the nodes of the
    contexts' prefix tree (sorted, each context costs what it does not share with the one before)."""
    ordered = sorted(map(tuple, contexts))
    total = 0
    before: tuple[int, ...] = ()
    for ctx in ordered:
        common = next((i for i, (x, y) in enumerate(zip(ctx, before)) if x != y), min(len(ctx), len(before)))
        total += len(ctx) - common
        before = ctx
    return total


def mmlu_contexts(model: str, out: dict[str, Any]) -> list[list[int]]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    texts = [s["arguments"][0][0] for s in out["samples"]["mmlu_val_local"]]
    return [llm.tokenize(t.rstrip().encode(), add_bos=True, special=True) for t in texts]


def alternate(rounds: int, ours: Callable[[], float], theirs: Callable[[], float], label: str) -> None:
    mine, peer = [], []
    for r in range(rounds):
        mine.append(ours())
        peer.append(theirs())
        print(f"{label} round {r + 1}: ggbatch {mine[-1]:.1f} s, peer {peer[-1]:.1f} s", flush=True)
    a, b = statistics.median(mine), statistics.median(peer)
    print(f"{label} median: ggbatch {a:.1f} s, peer {b:.1f} s: ggbatch {b / a:.2f}x as fast", flush=True)


def run_mmlu(model: str, folder: Path, rounds: int, settings: dict[str, Any], peer: bool, gpu_layers: int,
             peer_in_child: bool) -> None:
    kept: dict[str, Any] = {}

    def ours() -> float:
        took, kept["ours"], stats = ggbatch_side(model, "mmlu_val_local", folder, settings)
        kept["computed"] = stats["prompt_tokens_computed"]
        print("mmlu ggbatch workers:", json.dumps(stats["workers"]), "thread changes:",
              json.dumps(stats["thread_changes"]), flush=True)
        return took

    def theirs() -> float:
        took, kept["theirs"], kept["peer_computed"] = llamacpp_side(model, folder, gpu_layers, peer_in_child)
        return took

    warm_up("mmlu_val_local", folder)
    if not peer:
        print(f"mmlu ggbatch alone: {statistics.median(ours() for _ in range(rounds)):.1f} s, prompt tokens "
              f"computed {kept['computed']}", flush=True)
        return
    alternate(rounds, ours, theirs, "mmlu")
    print("mmlu:", compare_mmlu(kept["ours"], kept["theirs"]))
    contexts = mmlu_contexts(model, kept["ours"])
    print(f"mmlu prompt tokens: {sum(map(len, contexts))} in the contexts, {prefix_tree_tokens(contexts)} in their "
          f"prefix tree; computed: ggbatch {kept['computed']}, peer {kept['peer_computed']}")


def run_gsm8k(model: str, folder: Path, rounds: int, settings: dict[str, Any], peer: bool,
              gpu_layers: int) -> None:
    kept: dict[str, Any] = {}

    def ours() -> float:
        took, kept["ours"], kept["stats"] = ggbatch_side(model, "gsm8k_local", folder, settings)
        return took

    def theirs() -> float:
        took, kept["theirs"] = server_side(model, folder, gpu_layers)
        return took

    warm_up("gsm8k_local", folder)
    if not peer:
        print(f"gsm8k ggbatch alone: {statistics.median(ours() for _ in range(rounds)):.1f} s", flush=True)
        return
    alternate(rounds, ours, theirs, "gsm8k")
    print("gsm8k:", compare_gsm8k(kept["ours"], kept["theirs"]))
    print("gsm8k ggbatch counters:", json.dumps({k: v for k, v in kept["stats"].items() if "token" in k}))


def task_options(description: str) -> argparse.ArgumentParser:
    """The options every lm-eval comparison takes: the model, the tasks and their sizes, the rounds."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default=None)
    ap.add_argument("--task", choices=("mmlu", "gsm8k", "both"), default="both")
    ap.add_argument("--mmlu", type=int, default=100, help="MMLU questions (default 100)")
    ap.add_argument("--gsm8k", type=int, default=32, help="GSM8K questions (default 32)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds, each side once a round")
    return ap


def write_tasks(folder: Path, args: argparse.Namespace) -> None:
    """Both local tasks in `folder`, of --mmlu and --gsm8k questions."""
    write_task(folder, "mmlu", MMLU_TASK, DATA / "mmlu" / "questions.jsonl", args.mmlu)
    write_task(folder, "gsm8k", GSM8K_TASK, DATA / "gsm8k" / "questions.jsonl", args.gsm8k)


def main() -> None:
    ap = task_options(__doc__.split("\n\n")[0])
    ap.add_argument("--ggbatch", default="", metavar="KEY=VALUE,...",
                    help="ggbatch's job keys for its side (as lm-eval's --model_args: workers=2,slots=16)")
    ap.add_argument("--no-peer", action="store_true", help="time ggbatch's side alone")
    ap.add_argument("--gpu-layers", default="0", help="layers on the GPU on every side: N or all (default 0)")
    ap.add_argument("--peer-in-child", action="store_true",
                    help="MMLU's peer holds its model in a process of its own (lm-eval's sends it tokens)")
    args = ap.parse_args()
    settings = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.ggbatch.split(",") if kv)}
    gpu_layers = -1 if args.gpu_layers == "all" else int(args.gpu_layers)  # llama.h: negative is every layer
    if gpu_layers:
        settings.setdefault("model.n_gpu_layers", args.gpu_layers)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from engine_bench import bench_model

    model = args.model or bench_model()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_tasks(folder, args)
        if args.task in ("mmlu", "both"):
            run_mmlu(model, folder, args.repeat, settings, not args.no_peer, gpu_layers, args.peer_in_child)
        if args.task in ("gsm8k", "both"):
            run_gsm8k(model, folder, args.repeat, settings, not args.no_peer, gpu_layers)


if __name__ == "__main__":
    main()
