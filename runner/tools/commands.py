"""The side tools' command lines: `ggbatch make-model`, `ggbatch bench`, `ggbatch tune`,
`ggbatch plot` (runner/cli.py adds them to the parser and runs them; `ggbatch run` is the job
path's)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from contextlib import nullcontext
from typing import Any, Callable, Optional

from ..config.checks import bool_or_auto
from ..config.checks import gpu_layers as parse_gpu_layers
from ..config.job_file import load_job_file
from ..config.keys import MAX_SLOTS, SCHEMA
from ..config.schema import key_said_by_call, model_refused_in_file
from ..errors import ConfigError, InputError, ModelError, quote
from ..files.outputs import write_atomic
from ..files.paths import check_output, check_writable, same_file, same_file_error, writable_cache
from ..files.piped import STDIN, readable_file
from ..model.hub import model_bytes
from ..model.identity import identify, resolve_model
from ..plan.layout import plan_layout, usable_cores
from ..plan.repack import cpu_flags, model_is_hybrid, repack_weights
from ..plan.repack_check import repack_refused
from ..plan.repack_share import nothing_to_repack
from ..words import counted, layout_words

log = logging.getLogger("ggbatch")


def add_tool_commands(sub: Any) -> None:
    _add_make_model(sub)
    _add_bench(sub)
    _add_tune(sub)
    _add_plot(sub)


def _add_make_model(sub: Any) -> None:
    mm = sub.add_parser("make-model", help="write a random-weight GGUF of a realistic shape",
                        description="Random weights (nonsense answers, real cost): for benchmarks and "
                                    "tests without downloading a model.")
    mm.add_argument("out", help="GGUF file to write")
    mm.add_argument("--shape", required=True,
                    help="llama: demo (0.4 MiB), bench-28x1024 (the benchmark model: 675 MiB at f16), "
                         "qwen3-0.6b-like, qwen3-1.7b-like; tiny models of other "
                         "architectures: qwen3-tiny (QK-norm), qwen3moe-tiny (experts), gemma3-tiny "
                         "(sliding window), mamba2-tiny (recurrent), lfm2-tiny, qwen35-tiny (hybrid)")
    mm.add_argument("--vocab", help="vocab-only GGUF whose tokenizer and chat template to copy "
                                    "(default: the project's own small tokenizer)")
    mm.add_argument("--quant", help="q4_k_m, q8_0, q4_0, ... (default: unquantized f16)")
    # default None, not False: without the flag each shape keeps its own tying
    mm.add_argument("--tie-embeddings", dest="tie_embeddings", action="store_true", default=None,
                    help="no output.weight: the logits use the token embeddings, as in Qwen3-0.6B/1.7B "
                         "(always so for the qwen3-*-like shapes)")
    # a negative seed got numpy's "expected non-negative integer", naming no option, after the vocab was read
    mm.add_argument("--seed", type=non_negative_int, default=0)
    mm.add_argument("--reasoning", choices=["think", "harmony"],
                    help="a reasoning model's vocabulary and chat template, opening its thinking block: "
                         "<think>...</think>, or gpt-oss's harmony channels")


def cmd_make_model(args: argparse.Namespace) -> int:
    from ..model.make import modelgen

    if args.vocab and not os.path.isfile(args.vocab):
        folder = os.path.isdir(args.vocab)
        why = "the vocab file (--vocab) is a directory, not a file" if folder else "vocab file not found"
        raise ConfigError(f"{args.vocab}: {why}")
    try:
        path = modelgen.make_model(args.out, args.shape, vocab=args.vocab, quant=args.quant, seed=args.seed,
                                   tie_embeddings=args.tie_embeddings, reasoning=args.reasoning)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(str(exc)) from None
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    return 0


def _add_bench(sub: Any) -> None:
    b = sub.add_parser("bench", help="measure this machine with this model, like llama-batched-bench, "
                                     "and the runner's overhead over the raw engine")
    b.add_argument("--model", required=True)
    b.add_argument("--npp", default="128", help="prompt tokens, comma-separated (default 128)")
    b.add_argument("--ntg", default="64", help="generated tokens, comma-separated (default 64)")
    b.add_argument("--npl", default="1,2,4,8,16", help="sequences per decode, comma-separated")
    b.add_argument("--workers", type=positive_int, default=1,
                   help="worker processes in the runner measurement (default 1)")
    b.add_argument("--threads", type=positive_int,
                   help="threads of the raw engine and of each worker (default: usable cores / workers)")
    b.add_argument("--repeat", type=positive_int, default=1,
                   help="runs per row; each time is the median (default 1; use 3 on a noisy machine)")
    b.add_argument("--repack", choices=["auto", "true", "false"], default="auto",
                   help="weights in llama.cpp's repacked layout (auto: as `ggbatch run` decides by CPU)")
    b.add_argument("--json", help="also write the rows here as JSON")
    b.add_argument("--plot", help="also draw S_TG and S against B into this image, in the format its extension names "
                   "(PNG without one; needs ggbatch[plot])")
    b.add_argument("--csv", help="also write the rows here as CSV")
    b.add_argument("--no-runner", dest="runner", action="store_false",
                   help="skip the runner-overhead measurement")
    b.add_argument("--gpu-layers", default="0",
                   help="layers stored in VRAM on the first GPU: N, all, or auto (no GPU, as a job without "
                        "--devices; default 0: the CPU alone)")


def positive_int(text: str) -> int:
    """argparse's type for a count that must be at least 1 (0 workers divides by zero, 0 threads
    or questions measure nothing)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse's type for a random seed (numpy takes none below 0)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    """argparse's error (`argument --seed: ...`) names the option, where the value's user would not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
    return value


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{flag}: expected integers >= 1, got {text!r}")
    return values


def _n_vocab(model: str) -> int:
    from ...workers.llama.load_errors import ModelLoadError
    from ...workers.llama.model_runner import Tokenizer

    try:
        tokenizer = Tokenizer(model)
    except ModelLoadError as exc:
        raise ModelError(str(exc)) from None
    n_vocab = int(tokenizer.n_vocab)
    tokenizer.close()
    return n_vocab


def _gpu_layers(text: str) -> int:
    try:
        value = parse_gpu_layers(text)
    except ValueError as exc:
        raise ConfigError(f"--gpu-layers: {exc}, got {text!r}") from None
    return value or 0  # auto: the CPU alone, as for a job without devices


def _bench_sizes(args: argparse.Namespace) -> tuple[list[int], list[int], list[int]]:
    """--npp, --ntg and --npl, checked."""
    npp, ntg, npl = _ints(args.npp, "--npp"), _ints(args.ntg, "--ntg"), _ints(args.npl, "--npl")
    if max(npl) > MAX_SLOTS:
        raise ConfigError(f"--npl: at most {MAX_SLOTS} sequences per decode (llama.cpp's 256 sequences per "
                          f"context, less the one of the shared prefix), got {max(npl)}")
    return npp, ntg, npl


def _tune_slots(text: str) -> list[int]:
    """--slots of tune, checked before the first trial: a count past the limit was refused only
    when its trials came, after the others had run, and nothing was saved."""
    slots = _ints(text, "--slots")
    if max(slots) > MAX_SLOTS:
        raise ConfigError(f"--slots: at most {MAX_SLOTS} slots per worker (llama.cpp's 256 sequences per "
                          f"context, less the one of the shared prefix), got {max(slots)}")
    return slots


BENCH_JSON, BENCH_CSV, BENCH_PLOT = "the bench table (--json)", "the bench table (--csv)", "the plot (--plot)"


def _check_bench_outputs(args: argparse.Namespace, model: str) -> None:
    """Bench's files, checked before the benchmark runs (a missing folder found after it would
    waste the run and leave the files after it unwritten): none may be the model, which writing
    the table would destroy, nor another of them."""
    from . import bench

    outputs = [(role, path) for role, path in ((BENCH_JSON, args.json), (BENCH_CSV, args.csv),
                                               (BENCH_PLOT, args.plot)) if path]
    for i, (role, path) in enumerate(outputs):
        check_output(path, role)
        for other_role, other in [("the model (--model)", model), *outputs[:i]]:
            if same_file(path, other):
                raise same_file_error(other_role, role, path, overwrites=other == model)
    if args.plot:
        try:
            bench.require_matplotlib()
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        from .plot import check_writable_format

        check_writable_format(args.plot)  # .xyz, or .pgf without TeX, refused before the benchmark


def _bench_repack(requested: Optional[bool], model: str) -> Callable[[int], bool]:
    """Whether a job of B sequences per worker would repack the weights (`repacked(B)`)."""
    flags, hybrid = cpu_flags(), model_is_hybrid(model)
    plain = nothing_to_repack(model, flags)
    refused = repack_refused(requested is False or hybrid or plain)
    return lambda b: repack_weights(requested, None, flags, b, hybrid=hybrid, refused=refused,
                                    nothing_to_repack=plain)[0]


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    model = resolve_model(args.model)
    npp, ntg, npl = _bench_sizes(args)
    threads = plan_layout(usable_cores(), workers=args.workers, threads=args.threads, slots=1,
                          n_questions=1).threads  # checks the cores
    _check_bench_outputs(args, model)
    gpu_layers = _gpu_layers(args.gpu_layers)
    n_vocab = _n_vocab(model)
    repacked = _bench_repack(bool_or_auto(args.repack), model)
    print(f"model {model}, {counted(threads, 'thread')}; raw engine, one context, no coordinator; weights repacked "
          f"or not as a job of B sequences per worker would ({args.repack}):", flush=True)
    columns = [*bench.COLUMNS, "repacked"]
    print(bench.header(columns), flush=True)
    rows = []
    for pp in npp:
        for tg in ntg:
            for b in npl:
                repack = repacked(b)
                rows.append({**bench.raw_row(model, threads, pp, tg, b, n_vocab, args.repeat, repack,
                                                  gpu_layers),
                             "repacked": int(repack)})
                print(bench.row_line(rows[-1], columns), flush=True)
    overhead = []
    if args.runner:
        processes = "process" if args.workers == 1 else "processes"
        print(f"\nthe whole runner ({args.workers} pinned worker {processes} × {counted(threads, 'thread')}) "
              "against "
              f"the raw engine (× {args.workers}), same work per worker:", flush=True)
        for pp in npp:
            for tg in ntg:
                repack = repacked(max(npl))
                overhead.append(bench.overhead_row(model, args.workers, threads, pp, tg, max(npl), n_vocab,
                                                   repack, gpu_layers))
        print(bench.format_table(overhead))
    if args.json:
        write_atomic(args.json, json.dumps({"raw": rows, "runner": overhead}, indent=1) + "\n", BENCH_JSON)
    if args.csv:
        write_atomic(args.csv, bench.to_csv(rows), BENCH_CSV)
    if args.plot:
        bench.plot(rows, args.plot, BENCH_PLOT)
        print(f"plot: {args.plot}")
    return 0


# Tune's own (a job file's values are left out): its files and their formats (it writes none of
# the job's; its sample is JSONL), the layouts it tries (each with its
# own thread count throughout: threads_adapt off), and where it tries them: this machine's
# CPU, in local processes (a job with GPU layers does not use the layouts; Ray's workers would
# run elsewhere).
TUNE_OWNS = {"model", "model.path", "input", "output", "report", "errors_output", "input_format",
             "output_format", "workers", "threads", "threads_adapt", "slots",
             "model.repack", "max_tokens", "ignore_eos", "model.n_gpu_layers", "devices", "shard",
             "backend", "ray_address"}


def _add_tune(sub: Any) -> None:
    t = sub.add_parser("tune", help="try layouts on a sample of your questions; `auto` then uses the fastest")
    t.add_argument("job", nargs="?", help="YAML job file (its prompt and sampling settings are used)")
    t.add_argument("--model", help="GGUF model path (or from the job file)")
    t.add_argument("--input", help="questions to sample (default: the job file's input, else built-in ones)")
    t.add_argument("--questions", type=positive_int, default=64, help="sample size (default 64)")
    t.add_argument("--max-tokens", dest="max_tokens", type=positive_int, default=32,
                   help="generated tokens per question, exactly (default 32)")
    t.add_argument("--slots", default="8,16,32,64", help="slot counts to try (default 8,16,32,64)")


def cmd_tune(args: argparse.Namespace) -> int:
    from ..plan import tuned
    from . import tune

    job = load_job_file(args.job) if args.job else {}
    # The job's prompt and sampling settings shape the trials; the layout and files are tune's.
    settings = {k: v for k, v in job.items() if k not in TUNE_OWNS}
    model = _tune_model(args, job)
    slot_options = _tune_slots(args.slots)
    source, source_format = _questions_to_sample(args, job)
    writable_cache("tune: cannot save the layout")  # before the trials, not after them
    log.setLevel(logging.WARNING)  # each trial's own progress lines would bury the results
    with readable_file(source) if source else nullcontext(None) as questions, \
            tempfile.TemporaryDirectory(prefix="ggbatch-tune-") as tmp:
        sample, n_questions = tune.write_sample(questions, args.questions, tmp, settings.get("fields.id", "questionID"),
                                                settings.get("fields.question", "question"), source_format)
        if not n_questions:
            raise InputError(f"{source}: no questions to sample")
        invariant = settings.get("batch_invariant") is True
        plain_only = tune.plain_weights_only(model, invariant)
        _say_trials(args, model, slot_options, n_questions, (invariant, plain_only))
        # a schema, grammar, template or choice the trials refuse is the job file's key, said so as a run does
        with key_said_by_call(args.job, settings) if args.job else nullcontext():
            choice, trials = tune.tune(model, sample, n_questions, args.max_tokens, slot_options, settings,
                                       _show_trial, plain_only)
    n_ctx_seq = tuned.sample_context(trials)
    path = tuned.save_choice(identify(model), choice, trials, n_ctx_seq)
    print(f"fastest: {layout_words(choice['workers'], choice['threads'], choice['slots'])}, "
          f"weights {'repacked' if choice['repack'] else 'not repacked'}; "
          f"saved to {path} under context {tuned.context_bucket(n_ctx_seq)} ({n_ctx_seq} tokens per sequence "
          f"here): `auto` uses it for this model on this machine when no saved context is nearer a job's")
    return 0


def _tune_model(args: argparse.Namespace, job: dict[str, Any]) -> str:
    """The model tune tries: --model, else the job file's, whose refusal names the file and key
    (as a run's does)."""
    if args.model:
        return resolve_model(args.model)
    key = "model.path" if job.get("model.path") else "model"
    if not job.get(key):
        raise ConfigError("tune: give --model or a job file with a model")
    try:
        return resolve_model(job[key])
    except ModelError as exc:
        raise model_refused_in_file(args.job, key, job[key], exc) from None


def _questions_to_sample(args: argparse.Namespace, job: dict[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(the file tune samples, its format; None: built-in questions, the format its name says): the
    job's own questions in the job's format, unless --input names others or the job reads them
    from its standard input, which tune leaves alone."""
    if args.input:
        return args.input, None
    if not job.get("input") or job["input"] == STDIN:
        return None, None
    fmt = job.get("input_format")
    try:
        return job["input"], None if fmt is None else SCHEMA["input_format"](fmt)
    except ValueError as exc:
        raise ConfigError(f"{args.job}: input_format: {exc}, got {quote(fmt)}") from None


def _say_trials(args: argparse.Namespace, model: str, slot_options: list[int], n_questions: int,
                plain: tuple[bool, bool]) -> None:
    """What tune is about to try, on how many questions (the file's all when it holds fewer than
    --questions), and how long it may take."""
    from . import tune

    n_cores = len(usable_cores())
    invariant, plain_only = plain  # batch_invariant, and plain_weights_only's answer
    trials = tune.candidates(n_cores, slot_options, n_questions, invariant, plain_only)
    estimate = tune.rough_seconds(model_bytes(model), len(trials), n_questions, args.max_tokens)
    fewer = f" (all the file holds; --questions {args.questions})" if n_questions < args.questions else ""
    print(f"trying {counted(len(trials), 'layout')} on {counted(n_questions, 'question')}{fewer} × "
          f"{counted(args.max_tokens, 'token')}: "
          f"{tune.said_duration(estimate)} (a rough guess)", flush=True)
    skipped = len(tune.candidates(n_cores, slot_options, 1 << 30, invariant, plain_only)) - len(trials)
    if skipped:
        their = "their slots are" if skipped > 1 else "its slots are"
        print(f"  ({counted(skipped, 'layout')} skipped: {their} more than {n_questions} questions can "
              "fill; a bigger --questions tries them)", flush=True)


def _show_trial(trial: dict[str, Any]) -> None:
    workers, threads = counted(trial['workers'], 'worker'), counted(trial['threads'], 'thread')
    print(f"  {workers:<9} × {threads:<9} × {counted(trial['slots'], 'slot'):>8}, "
          f"weights {'repacked    ' if trial['repack'] else 'not repacked'}: "
          f"{trial['generated_tok_s']:7.1f} generated tok/s", flush=True)


def _add_plot(sub: Any) -> None:
    p = sub.add_parser("plot", help="draw a run's timeline from its report (needs ggbatch[plot])",
                       description="Questions done, generated and prompt tokens/s, busy slots, CPU and PSS "
                                   "over the run, per worker, from `ggbatch run --report`'s timeline.")
    p.add_argument("report", help="a report written by ggbatch run --report")
    p.add_argument("-o", "--output", help="PNG to write (default: the report's name with .png)")


def cmd_plot(args: argparse.Namespace) -> int:
    from . import plot

    out = args.output or os.path.splitext(args.report)[0] + ".png"
    plot.require_matplotlib()
    report = plot.read_report(args.report)
    if os.path.exists(out) and os.path.samefile(out, args.report):
        raise ConfigError(f"{out}: the plot would overwrite the report it is drawn from")
    check_writable(out, plot.PLOT)
    plot.save(report, out)
    print(f"plot: {out}")
    return 0


TOOL_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "make-model": cmd_make_model, "bench": cmd_bench, "tune": cmd_tune, "plot": cmd_plot}
