"""Command line: `ggbatch run [JOB.yaml] [flags]`. The only place errors become exit codes.

Exit codes: 0 all answered; 1 some questions failed or have no answer, or the run gave up on its workers (the
answers file says which and why); 2 bad usage, config, input, model, files or limits; 130 / 143
interrupted (README, "Exit codes"). The side tools' subcommands are runner/tools/commands.py's.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import shlex
import sys
from dataclasses import replace
from typing import Any, Callable, NoReturn, Optional, Sequence, TextIO, cast

from ..workers.limits import under_address_space_limit
from .closed_pipe import ClosedPipeSafe
from .config.job_file import load_job_file
from .config.keys import SCHEMA
from .config.schema import LOGLIKELIHOOD, JobConfig, build_config
from .errors import GgbatchError, Interrupted, StartOver, WorkerFailure
from .files.formats import FORMATS
from .files.paths import journal_of
from .files.piped import is_copy, readable_input, shown_name
from .merge.command import add_merge_parser, cmd_merge
from .pool.signals import STOP
from .scoring.command import add_score_parser, cmd_score, print_run_score
from .tools.commands import TOOL_COMMANDS, add_tool_commands
from .tools.eval_command import add_eval_parser, cmd_eval
from .watch.progress import setup_logging

log = logging.getLogger("ggbatch")


class _Parser(argparse.ArgumentParser):
    """A mistyped flag or value is one line naming it, as every other error is, not the whole usage
    (which --help gives)."""

    _words: Sequence[str] = ()

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:  # kept for error(): the words parsed
        given = args[0] if args else kwargs.get("args")
        self._words = list(sys.argv[1:] if given is None else given)
        return super().parse_known_args(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse says a required flag is missing before it hands on the words it did not know:
        # `--ouput X` reads as if --output had not been typed unless the misspelling is named.
        if message.startswith("the following arguments are required"):
            message += _did_you_mean(self, self._words, listed=False)
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ggbatch", description="Answer a file of questions "
                                     "with a local GGUF model, using every core.")
    parser.add_argument("--version", action=VersionAction, help="ggbatch's, llama-cpp-python's and "
                        "llama.cpp's versions and the CPU features llama.cpp uses")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    add_tool_commands(sub)
    add_score_parser(sub)
    add_merge_parser(sub)
    add_eval_parser(sub)
    return parser


def _add_answer_flags(a: Callable[..., Any]) -> None:
    """Sampling, and what an answer must be."""
    a("--temperature", dest="sampling.temperature")
    a("--top-k", dest="sampling.top_k")
    a("--top-p", dest="sampling.top_p")
    a("--min-p", dest="sampling.min_p")
    a("--repeat-penalty", dest="sampling.repeat_penalty")
    a("--presence-penalty", dest="sampling.presence_penalty",
      help="OpenAI's: subtracted from a token's logit once it is in the answer (-2 to 2)")
    a("--frequency-penalty", dest="sampling.frequency_penalty",
      help="OpenAI's: subtracted from a token's logit for each time it is in the answer (-2 to 2)")
    a("--seed", dest="sampling.seed", help="job seed; each question's seed derives from it and the question id")
    a("--n", dest="sampling.n", metavar="N",
      help="answers per question (samples: needs --temperature > 0), all from one computation of its prompt; "
           "written as a list")
    a("--choices", dest="answer.choices",
      help="the answer is exactly one of these: A,B,C,D, or auto (each record's 'choices')")
    a("--choice-logprobs", dest="answer.logprobs", action=argparse.BooleanOptionalAction, default=None,
      help="with --choices: write each choice's log-probability (choice_logprobs): choices of one token "
           "each (a choice of several is refused); with --choice-scoring loglikelihood, any choice, the sum "
           "over its tokens")
    a("--choice-scoring", dest="answer.choice_scoring", choices=["first_token", "loglikelihood"],
      help="with --choices: first_token (default: the choice the model writes), or loglikelihood: each "
           "choice scored as a continuation of the prompt; the answer is lm-eval's acc pick, answer_norm its acc_norm")
    a("--token-logprobs", dest="answer.token_logprobs", metavar="K",
      help="write each answer token's log-probability and the K most likely tokens there (0-20; 0: the "
           "token's alone) as token_logprobs")
    a("--json-schema", dest="answer.json_schema",
      help="the answer is JSON valid under this schema (a .json file, or inline)")
    a("--grammar", dest="answer.grammar", help="the answer matches this GBNF grammar (llama.cpp's; root rule 'root')")
    a("--thinking-budget", dest="reasoning.max_tokens", metavar="N",
      help="a reasoning model thinks N tokens at most, then its </think> (gpt-oss: the final channel) is "
           "written for it and it answers (reasoning.max_tokens); choices and grammars hold the answer after it")


def _add_run(sub: Any) -> None:
    run = sub.add_parser("run", help="answer a question file",
                         description="Flags override the job file; the job file overrides defaults.")
    run.add_argument("job", nargs="?", help="YAML job file (see jobs/example.yaml)")
    a = _key_flag(run.add_argument)
    _add_file_flags(a)
    _add_layout_flags(a)
    a("--max-tokens", dest="max_tokens", help="most tokens generated per answer (default 256)")
    a("--system", help="system prompt")
    a("--template", dest="prompt.template", help="Jinja template over the record's fields giving the user message")
    a("--chat-template", dest="prompt.chat_template", help="auto (the model's), plain, or a Jinja chat template")
    a("--stop", action="append", help="stop string (repeatable)")
    a("--ignore-eos", dest="ignore_eos", action=argparse.BooleanOptionalAction, default=None,
      help="generate max tokens even past end-of-generation (benchmarks)")
    a("--batch-invariant", dest="batch_invariant", action=argparse.BooleanOptionalAction, default=None,
      help="answers never depend on what they are batched with (per-sequence KV; slower)")
    a("--prefix-cache", dest="prefix_cache", choices=["auto", "off"],
      help="auto: questions that share a prefix (a passage, few-shot examples) go to a worker together "
           "and reuse its KV; off: only the prefix every prompt shares is reused")
    a("--keep-thinking", dest="keep_thinking", action=argparse.BooleanOptionalAction, default=None,
      help="write a reasoning model's <think> block too, as \"thinking\" (it is always cut from the answer)")
    a("--id-field", dest="fields.id", help="record field holding the id (default questionID)")
    a("--question-field", dest="fields.question", help="record field holding the question (default question)")
    _add_answer_flags(a)
    a("--fresh", action="store_true", help="ignore the journal of an earlier run and start over")
    a("--score", action="store_true", help="then score the answers against the input's gold 'answer' fields")
    a("--progress", choices=["auto", "bar", "log", "off"], default="auto",
      help="bar on a terminal, periodic log lines otherwise (auto)")
    a("-v", "--verbose", action="store_true", help="log worker start-up and errors in detail")
    a("-q", "--quiet", action="store_true",
      help="for scripts: no progress, no summary, no warnings; errors only (the exit code says the rest)")


def _add_layout_flags(a: Any) -> None:
    """Where and how the workers run: processes, threads, slots, context, weights, GPUs, backend."""
    a("--workers", help="worker processes, or auto")
    a("--threads", help="threads per worker, or auto (= usable cores / workers)")
    a("--threads-adapt", dest="threads_adapt", choices=["auto", "off"],
      help="auto: run fewer llama.cpp threads while other processes take a worker's cores, and take them back "
           "when the cores are free (default); off: always the layout's")
    a("--slots", help="sequences decoded together per worker, or auto")
    a("--n-ctx", dest="model.n_ctx", help="context tokens per sequence, or auto (longest prompt + max tokens)")
    a("--repack", dest="model.repack", choices=["auto", "true", "false"],
      help="copy the weights into llama.cpp's repacked layout (auto: by CPU, or as ggbatch tune measured)")
    a("--flash-attn", dest="flash_attn", choices=["auto", "true", "false"],
      help="llama.cpp's flash attention (auto: off on a CPU up to 4096 tokens a sequence, where its kernel "
           "decodes several times slower; llama.cpp's choice past that or with layers on a GPU; off for "
           "--choice-scoring loglikelihood, whose numbers it moves by up to about 0.01 nats a token; off with "
           "--batch-invariant, which refuses true)")
    a("--gpu-layers", "-ngl", dest="model.n_gpu_layers",
      help="layers llama.cpp stores in VRAM: a number, all, or auto (all with --devices, else none); "
           "needs a llama-cpp-python built with CUDA, Metal, ... (docs/guide/gpu.md)")
    a("--devices", help="GPUs, as 0,1: one worker per GPU, which sees only its own")
    a("--backend", choices=["local", "ray"],
      help="where workers live: local processes (default), or Ray actors on a cluster's nodes (needs ggbatch[ray])")
    a("--ray-address", dest="ray_address",
      help="with --backend ray: auto or HOST:PORT of the cluster to join; left out: start a Ray instance "
           "of its own on this machine, even where a cluster runs")
    a("--n-batch", dest="n_batch", help="token budget of one decode step, or auto (512; 1024 with the prefix cache)")


class VersionAction(argparse.Action):
    """--version: described only when asked (it loads llama.cpp)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from .model.versions import describe

        print(describe())
        parser.exit()


def _add_file_flags(a: Any) -> None:
    """The run's model and files, and their formats (runner/files/formats)."""
    a("--model", help="GGUF model path, 'demo' for the generated demo model, or hf:OWNER/REPO/FILE.gguf or "
      "OWNER/REPO:QUANT from the Hugging Face cache (needs ggbatch[hf])")
    a("--input", help="question file: .json (array), .jsonl, .csv, or an OpenAI Batch input file; - reads it "
      "from standard input")
    a("--output", help="answers file: .json (array), .jsonl, .csv, or OpenAI Batch output")
    a("--input-format", dest="input_format", choices=["auto", *FORMATS],
      help="the question file's format (auto: by extension and content)")
    a("--output-format", dest="output_format", choices=["auto", *FORMATS],
      help="the answers file's format (auto: .csv CSV, .json JSON; else OpenAI Batch output for an OpenAI "
           "Batch input, JSON Lines for .jsonl and .ndjson, JSON for any other name)")
    a("--errors-output", dest="errors_output",
      help="write the questions without an answer here instead of in the output (as OpenAI's error file)")
    a("--report", help="write the run report (JSON) here")
    a("--shard", help="I/N: answer only shard I of N (from 0; split by a hash of the question id) into "
      "OUTPUT.shard-I-of-N.EXT; auto: this task's shard of a Slurm job array. Join them with ggbatch merge")


def _flag_layer(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given that set a job key: their dest is the key (_key_flag)."""
    return {dest: value for dest, value in vars(args).items() if dest in SCHEMA and value is not None}


def _key_flag(add: Callable[..., Any]) -> Callable[..., Any]:
    """`run`'s add_argument: a flag that sets a job key has the dotted key as its dest, so the
    flag's definition says which key it sets (sampling.top_k) and _flag_layer reads it back; the
    value's name in --help stays the flag's (TOP_K)."""
    def a(*names: str, **options: Any) -> Any:
        if "." in options.get("dest", "") and not {"metavar", "choices", "action"} & set(options):
            options["metavar"] = names[0].lstrip("-").replace("-", "_").upper()
        return add(*names, **options)
    return a


def cmd_run(args: argparse.Namespace) -> int:
    layers = []
    if args.job:
        layers.append((args.job, load_job_file(args.job)))
    layers.append(("command line", _flag_layer(args)))
    config = build_config(layers)
    # --score reads the questions again once the run is over: questions piped in are copied once, for both
    try:
        with STOP.run(), readable_input(config.input, config.output, lambda: STOP.signum) as name:
            return _run_and_score(args, replace(config, input=name))
    except Interrupted as exc:  # the run's own stops are said by _run_and_score: this one came as the copy was made
        print(f"ggbatch: stopped by signal {exc.signum} while the questions were read from "
              f"{shown_name(config.input)}; nothing was answered", file=sys.stderr)
        return exc.exit_code


def _run_and_score(args: argparse.Namespace, config: JobConfig) -> int:
    from .job import run_job
    from .report.report import format_summary, format_written

    try:
        report = run_job(config, progress="off" if args.quiet else args.progress, fresh=args.fresh,
                         job_file=args.job)
    except StartOver as exc:  # said in run_job's terms, fresh=True
        raise exc.said_as("run with --fresh") from None
    except Interrupted as exc:
        print(f"ggbatch: stopped by signal {exc.signum}; the answers so far are in {config.output} (the "
              f"others marked) and in {journal_of(config.output)}: run the same "
              "command again to finish", file=sys.stderr)
        return exc.exit_code
    except WorkerFailure as exc:
        print(f"ggbatch: error: {exc}; the answers so far are in {config.output}, the others marked "
              "as not answered", file=sys.stderr)
        return exc.exit_code
    if not args.quiet:
        print(format_summary(report))
        print(format_written(report, config.output, config.errors_output)
              + (f", report to {config.report}" if config.report else ""))
    if args.score and not args.quiet:  # quiet: the exit code says the rest
        try:
            with STOP.at_once():
                print_run_score(config.input, config.output, config.id_field, config.choice_scoring == LOGLIKELIHOOD)
        except Interrupted as exc:  # the run had ended: every answer is written, only the table is missing
            gold = "QUESTIONS" if is_copy(config.input) else shlex.quote(config.input)  # a pipe is read
            print(f"ggbatch: stopped by signal {exc.signum} while scoring; the answers are all in "
                  f"{config.output}: score them with ggbatch score --answers {shlex.quote(config.output)} "
                  f"--gold {gold}", file=sys.stderr)
            return exc.exit_code
    # A row without an answer in a run that ended by itself is never a success either.
    return 1 if report.failed or report.not_answered else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "eval":  # eval hands the options it does not know to lm-eval
        command_parser = _command_parser(parser, args.command)
        command_parser.error(f"unrecognized arguments: {' '.join(extra)}{_did_you_mean(command_parser, extra)}")
    args.lm_eval_args = extra
    setup_logging(getattr(args, "verbose", False), getattr(args, "quiet", False))
    try:
        return _command(args)
    except GgbatchError as exc:
        print(f"ggbatch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ggbatch: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"ggbatch: error: out of memory{under_address_space_limit()}", file=sys.stderr)
        return 2


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The subcommand's own parser, whose error names `ggbatch COMMAND --help`."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return cast(argparse.ArgumentParser, subparsers.choices[command])


def _did_you_mean(command_parser: argparse.ArgumentParser, words: Sequence[str], listed: bool = True) -> str:
    """The closest known flag for each unknown one among `words` (argparse offers none before
    Python 3.14); a known flag, or an abbreviation argparse takes for one, gets no hint. A lone
    hint names its flag only where the error has not `listed` the unknown words already."""
    known = [flag for action in command_parser._actions for flag in action.option_strings]
    hints = {}
    for word in words:
        flag = word.split("=", 1)[0]
        if not flag.startswith("-") or any(k.startswith(flag) for k in known):
            continue
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7)
        if close:
            hints[flag] = close[0]
    if len(hints) == 1 and listed:
        return f"; did you mean {next(iter(hints.values()))}?"
    return "".join(f"; {flag}: did you mean {close}?" for flag, close in hints.items())


def _command(args: argparse.Namespace) -> int:
    """The command's exit code. SIGINT and SIGTERM stay ggbatch's (runner/entry.py took them) for
    a run only; a signal the run did not answer goes on to Python's handlers as it ends."""
    if args.command != "run":
        STOP.uninstall()
    try:
        if args.command == "eval":
            return cmd_eval(args, args.lm_eval_args)
        return {"run": cmd_run, "score": cmd_score, "merge": cmd_merge, **TOOL_COMMANDS}[args.command](args)
    finally:
        STOP.uninstall()


def entry_point() -> None:
    sys.stdout = cast(TextIO, ClosedPipeSafe(sys.stdout))  # a reader gone early is no error
    sys.stderr = cast(TextIO, ClosedPipeSafe(sys.stderr))  # nor on stderr (`|& head`, a cron job's)
    code = main()
    sys.stdout.flush()
    sys.exit(code)
