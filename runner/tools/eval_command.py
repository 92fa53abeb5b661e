"""`ggbatch eval --model M.gguf --tasks T [lm-eval's options]`: lm-evaluation-harness's own command
line, run with ggbatch's model (ggbatch.lm_eval.GgbatchLM, registered as `ggbatch`). Every option but
--model goes to lm-eval as written (--tasks, --num_fewshot, --limit, --include_path, --output_path,
...); ggbatch's own settings go in --model_args (workers=2,slots=16,... or JSON), which must not name
the model again. Without --device the model stays where ggbatch keeps it (off the GPU), not on
lm-eval's default device. lm-eval is the optional extra ggbatch[eval]: without it the command says
how to install it (exit 2), as it says a task lm-eval does not know or a data set it cannot reach
(one line, exit 2: neither is a question that failed)."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Optional, Sequence

from ..errors import ConfigError, quote
from ..files.paths import check_folder_to_make

INSTALL = "ggbatch eval needs lm-eval (lm-evaluation-harness): pip install 'ggbatch[eval]'"


def add_eval_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a model on lm-evaluation-harness tasks (needs ggbatch[eval])",
                       description="Run lm-evaluation-harness with ggbatch as its model: every option but "
                       "--model is lm-eval's (--tasks, --num_fewshot, --limit, --include_path, --output_path, "
                       "--model_args for ggbatch's own settings such as workers=2,slots=16, ...).")
    p.add_argument("--model", required=True, help="the GGUF model (a path, or a Hugging Face name)")


def cmd_eval(args: argparse.Namespace, lm_eval_args: Sequence[str]) -> int:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise ConfigError(INSTALL) from None
    from ggbatch.lm_eval import speed_up_lm_eval  # (and registers the `ggbatch` model with lm-eval)

    rest = list(lm_eval_args)
    given = given_options(rest)
    twice = sorted({"model", "pretrained"} & set(given.model_args or {}))
    if twice:
        raise ConfigError(f"ggbatch eval: give the GGUF model once: --model {args.model} names it, "
                          f"--model_args gives {twice[0]}={quote(given.model_args[twice[0]])} too")
    if given.output_path is not None:
        # lm-eval makes the folder after the whole evaluation and, if it cannot write there,
        # logs a warning and exits 0: the results would be lost without a word
        output = Path(given.output_path)
        check_folder_to_make(given.output_path, str(output.parent if output.suffix == ".json" else output),
                             "lm-eval's results (--output_path)")
    if given.device is None and not config_sets_device(given.config):
        # lm-eval's own default, cuda:0, would put every layer on the GPU (GgbatchLM's device);
        # ggbatch's default keeps them off it unless asked
        rest += ["--device", "cpu"]
    # The model goes first as lm-eval's JSON model_args; the user's --model_args (key=value,
    # several values, or JSON) follow, as written, and lm-eval merges them in.
    sys.argv = ["lm_eval", "run", "--model", "ggbatch", "--model_args", json.dumps({"model": args.model}), *rest]
    # lm-eval's own time around the model's, once the command is known to run: its task index
    # (importing its tasks, a second), its templates compiled again and again
    speed_up_lm_eval()
    try:
        cli_evaluate()
    except Exception as exc:  # one the command could not run as given is said in one line; the rest keep theirs
        error = usage_error(exc, given.tasks, given.include_path)
        if error is None:
            raise
        raise error from None
    return 0


TASKS_NOT_FOUND = "Tasks not found: "  # lm-eval's ValueError for a name no task or group has
LOCAL_TASKS = ("or use a task over local files (dataset_path: json; docs/guide/evaluation.md, "
               "'Tasks over local files')")


def _closest_tasks(missing: str, include_path: Optional[str]) -> str:
    """"; did you mean ...?" with the task, group or tag name closest to each one missing (lm-eval
    joins them with ", "), or "" where none is close. Its task index is read again: lm-eval's
    error does not carry the one it searched (ggbatch keeps it, so about a second)."""
    from lm_eval.tasks import TaskManager

    names, known = missing.split(", "), TaskManager(include_path=include_path).all_tasks
    close = {name: difflib.get_close_matches(name, known, n=1, cutoff=0.8) for name in names}
    meant = [f"{match[0]}" + (f" (for {name})" if len(names) > 1 else "") for name, match in close.items() if match]
    return f"; did you mean {', '.join(meant)}?" if meant else ""


def usage_error(exc: Exception, tasks: Optional[str], include_path: Optional[str] = None) -> Optional[ConfigError]:
    """The one line for what lm-eval raises when the command cannot run as given: a task it does
    not know, a data set the datasets library cannot reach. None for anything else, which is a bug
    and keeps its traceback: the same exception types come from many other places, so each is
    matched by lm-eval's message or by where the datasets library raised it."""
    if isinstance(exc, ValueError) and str(exc).startswith(TASKS_NOT_FOUND):
        missing = str(exc)[len(TASKS_NOT_FOUND):]
        broken = unreadable_yaml(include_path)  # lm-eval leaves such a file out with a warning
        return ConfigError(f"ggbatch eval: lm-eval has no task named {missing}" + (
            f": {broken}" if broken else _closest_tasks(missing, include_path) + " (`lm-eval ls tasks` lists them; "
            "a task of your own: --include_path DIR with its YAML)"))
    if (type(exc).__module__, type(exc).__name__) == ("jinja2.exceptions", "UndefinedError"):  # a task's template
        return ConfigError(f"ggbatch eval --tasks {tasks}: the task's templates name what its data does not hold: "
                           f"{one_line(exc)}")
    gold = gold_out_of_choices(exc, tasks)
    if gold is not None:
        return ConfigError(f"ggbatch eval --tasks {tasks}: {gold}")
    if not raised_in(exc.__traceback__, "datasets."):
        return None
    where = f"ggbatch eval --tasks {tasks}: cannot load the task's data set: "
    unreadable = data_file_error(exc)
    if unreadable is not None:
        return ConfigError(where + unreadable)
    if not isinstance(exc, OSError):
        return None
    where += one_line(exc)
    if not isinstance(exc, ConnectionError):  # datasets' DatasetNotFoundError, a missing data file
        return ConfigError(where)
    from datasets import config

    why = ("HF_DATASETS_OFFLINE is set and the data set is not in the datasets cache: download it once "
           "with the network, " if config.HF_DATASETS_OFFLINE else
           "no network? HF_DATASETS_OFFLINE=1 uses the data sets already in the datasets cache, ")
    return ConfigError(f"{where}; {why}{LOCAL_TASKS}")


def gold_out_of_choices(exc: Exception, tasks: Optional[str]) -> Optional[str]:
    """What is wrong where lm-eval's task raised IndexError trying its first document's gold answer
    (doc_to_target, an index) on its choices (doc_to_choice): the index past them, in words;
    None for any other exception. Read from that frame's own variables, as lm-eval says no more."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if not isinstance(exc, IndexError) or tb is None:
        return None
    frame = tb.tb_frame
    target, choices = frame.f_locals.get("test_target"), frame.f_locals.get("test_choice")
    if (frame.f_globals.get("__name__") != "lm_eval.api.task" or frame.f_code.co_name != "__init__"
            or not isinstance(target, int) or not isinstance(choices, list)):
        return None
    task = getattr(getattr(frame.f_locals.get("self"), "config", None), "task", None)
    # the task named where --tasks names others (several, or a group)
    named = f"task {task}: " if task and task != tasks else ""
    return (f"{named}the gold answer (doc_to_target) of its first document is choice {target}, but doc_to_choice "
            f"gives {len(choices)} choices (0 to {len(choices) - 1})")


def unreadable_yaml(folder: Optional[str]) -> Optional[str]:
    """The first task YAML under --include_path that is not YAML, and why, with its line (lm-eval's
    own tags, `!function`, read as anything); None where every one reads."""
    import yaml

    class Tolerant(yaml.SafeLoader):
        pass

    Tolerant.add_multi_constructor("", lambda loader, suffix, node: None)
    files = sorted(Path(folder).rglob("*.y*ml")) if folder and Path(folder).is_dir() else []
    for file in files:
        try:
            yaml.load(file.read_text(encoding="utf-8"), Loader=Tolerant)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            return f"{file}{line}: not a task lm-eval can read ({getattr(exc, 'problem', None) or one_line(exc)})"
    return None


def data_file_error(exc: Exception) -> Optional[str]:
    """What a data file the datasets library could not read says (a .jsonl line that is not JSON):
    its DatasetGenerationError says only "An error occurred while generating the dataset", so the
    words are its cause's (and that cause's own, the reader's last try: "Trailing data at
    position 51"), after the file where the reader names it. None for any other exception."""
    from datasets.exceptions import DatasetGenerationError

    if not isinstance(exc, DatasetGenerationError):
        return None
    words: list[str] = []
    cause: Optional[BaseException] = exc.__cause__ or exc
    while cause is not None and len(words) < 2:
        if one_line(cause) and one_line(cause) not in words:
            words.append(one_line(cause))
        cause = cause.__cause__ or cause.__context__
    file = reading_file(exc.__cause__)
    return (f"{file}: " if file else "") + "; ".join(words or [one_line(exc)])


def reading_file(exc: Optional[BaseException]) -> Optional[str]:
    """The data file the datasets library's reader had open when it raised `exc` (its `file`
    variable, in the innermost of its frames that has one), or None: the exception says not."""
    tb = exc.__traceback__ if exc is not None else None
    file = None
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", "")
        value = tb.tb_frame.f_locals.get("file")
        if str(name).startswith("datasets.packaged_modules.") and isinstance(value, str):
            file = value
        tb = tb.tb_next
    return file


def raised_in(tb: Optional[TracebackType], package: str) -> bool:
    """Whether the innermost frame of the traceback is in a module of `package` ("datasets.")."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and str(last.tb_frame.f_globals.get("__name__", "")).startswith(package)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"ggbatch eval: {message}")


def given_options(rest: Sequence[str]) -> argparse.Namespace:
    """The lm-eval options cmd_eval looks at (--model_args merged as lm-eval merges them,
    --device, --config, --tasks, --output_path), read by lm-eval's own rules; ConfigError for a --model_args lm-eval
    cannot read."""
    from lm_eval._cli.utils import MergeDictAction

    parser = _Parser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model_args", "-a", nargs="+", action=MergeDictAction, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--config", "-C", default=None)
    parser.add_argument("--tasks", "-t", default=None)
    parser.add_argument("--output_path", "-o", default=None)
    parser.add_argument("--include_path", default=None)
    try:
        return parser.parse_known_args(rest)[0]
    except ValueError as exc:  # lm-eval's JSON refusal
        raise ConfigError(f"ggbatch eval: --model_args: {exc}") from None


def config_sets_device(path: Optional[str]) -> bool:
    """Whether lm-eval's --config file gives a device (one that cannot be read: lm-eval says so)."""
    if path is None:
        return False
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True
    return isinstance(data, dict) and data.get("device") is not None
