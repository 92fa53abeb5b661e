"""`ggbatch eval --model M.gguf --tasks T [lm-eval's options]`: lm-evaluation-harness's own command
line, run with ggbatch's model (ggbatch.lm_eval.GgbatchLM, registered as `ggbatch`). Every option but
--model goes to lm-eval as written (--tasks, --num_fewshot, --limit, --include_path, --output_path,
...); ggbatch's own settings go in --model_args (workers=2,slots=16,...). lm-eval is the optional extra
ggbatch[eval]: without it the command says how to install it (exit 2)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from ..errors import ConfigError

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
    model_args = f"model={args.model}"
    if "--model_args" in rest:
        i = rest.index("--model_args")
        model_args += "," + rest.pop(i + 1)
        rest.pop(i)
    sys.argv = ["lm_eval", "run", "--model", "ggbatch", "--model_args", model_args, *rest]
    cli_evaluate()
    return 0
