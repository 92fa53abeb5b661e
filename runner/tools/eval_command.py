"""`ggbatch eval --model M.gguf --tasks T [lm-eval's options]`: lm-evaluation-harness's own command
line, run with ggbatch's model (ggbatch.lm_eval.GgbatchLM, registered as `ggbatch`). Every option but
--model goes to lm-eval as written (--tasks, --num_fewshot, --limit, --include_path, --output_path,
...); ggbatch's own settings go in --model_args (workers=2,slots=16,... or JSON), which must not name
the model again. Without --device the model stays where ggbatch keeps it (off the GPU), not on
lm-eval's default device. lm-eval is the optional extra ggbatch[eval]: without it the command says
how to install it (exit 2)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from ..errors import ConfigError, quote

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
    import ggbatch.lm_eval  # noqa: F401  (registers the `ggbatch` model with lm-eval)

    rest = list(lm_eval_args)
    given = given_options(rest)
    twice = sorted({"model", "pretrained"} & set(given.model_args or {}))
    if twice:
        raise ConfigError(f"ggbatch eval: give the GGUF model once: --model {args.model} names it, "
                          f"--model_args gives {twice[0]}={quote(given.model_args[twice[0]])} too")
    if given.device is None and not config_sets_device(given.config):
        # lm-eval's own default, cuda:0, would put every layer on the GPU (GgbatchLM's device);
        # ggbatch's default keeps them off it unless asked
        rest += ["--device", "cpu"]
    # The model goes first as lm-eval's JSON model_args; the user's --model_args (key=value,
    # several values, or JSON) follow, as written, and lm-eval merges them in.
    sys.argv = ["lm_eval", "run", "--model", "ggbatch", "--model_args", json.dumps({"model": args.model}), *rest]
    cli_evaluate()
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"ggbatch eval: {message}")


def given_options(rest: Sequence[str]) -> argparse.Namespace:
    """The lm-eval options cmd_eval looks at (--model_args merged as lm-eval merges them,
    --device, --config), read by lm-eval's own rules; ConfigError for a --model_args lm-eval
    cannot read."""
    from lm_eval._cli.utils import MergeDictAction

    parser = _Parser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model_args", "-a", nargs="+", action=MergeDictAction, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--config", "-C", default=None)
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
