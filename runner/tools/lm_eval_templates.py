"""lm-eval's prompt templates compiled once each, for `ggbatch eval`.

lm-eval writes every text of a task (each question, each few-shot example, each target and
choice) by rendering a Jinja template string from the task's YAML, and its `apply_template`
compiles that string again at every call (lm-evaluation-harness issue #1286). 100 five-shot MMLU
questions render 1,502 texts: 0.78-0.93 s of compiling on this project's 2-core machine, where the
whole log-likelihood call on a two-layer model took 0.62-0.76 s (on a GPU the model's work is that
small). The same function over templates compiled once per string (kept by their source) renders
the same texts in 0.12-0.18 s.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Callable

# Distinct template strings kept compiled: a task has a handful (doc_to_text, doc_to_target,
# doc_to_choice, ...), a run of many tasks some hundreds.
TEMPLATES_KEPT = 4096


def compile_templates_once() -> bool:
    """lm_eval.utils.apply_template replaced by the same rendering from templates compiled once each
    (lm-eval's own Jinja environment, so its filters and undefined-name errors are the same). False,
    and lm-eval left as it is, where its apply_template is not the function this replaces (another
    lm-eval version: its two arguments, a template and a document, rendered by `utils.env`)."""
    from lm_eval import utils

    current: Callable[..., Any] = utils.apply_template
    if getattr(current, "compiled", None) is not None:
        return True
    if not hasattr(utils, "env") or list(inspect.signature(current).parameters) != ["template", "doc"]:
        return False
    compiled = lru_cache(maxsize=TEMPLATES_KEPT)(utils.env.from_string)

    def apply_template(template: str, doc: dict[str, Any]) -> str:
        rendered = compiled(template) if isinstance(template, str) else utils.env.from_string(template)
        return str(rendered.render(**doc))

    apply_template.compiled = compiled  # type: ignore[attr-defined]  # its cache, for tests and a second call
    utils.apply_template = apply_template
    return True
