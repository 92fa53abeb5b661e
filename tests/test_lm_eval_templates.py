"""`ggbatch eval` compiles each of lm-eval's prompt templates once (runner/tools/lm_eval_templates.py):
lm-eval's requests must be the very texts its own apply_template writes, compiled again each time."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def utils(monkeypatch):
    """lm-eval's utils module, its apply_template restored after the test."""
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from lm_eval import utils

    monkeypatch.setattr(utils, "apply_template", utils.apply_template)
    return utils


def requests_of(tasks: list[str], folder: str) -> dict[str, list[Any]]:
    """Every request lm-eval makes of a model for these local tasks (three documents each, two shots)."""
    import lm_eval
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

    seen: dict[str, list[Any]] = {"loglikelihood": [], "loglikelihood_rolling": [], "generate_until": []}

    class Recorder(LM):
        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
            seen["loglikelihood"] += [r.args for r in requests]
            return [(0.0, False)] * len(requests)

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            seen["loglikelihood_rolling"] += [r.args for r in requests]
            return [0.0] * len(requests)

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            seen["generate_until"] += [r.args for r in requests]
            return [""] * len(requests)

    lm_eval.simple_evaluate(model=Recorder(), tasks=tasks, num_fewshot=2, limit=3,
                            task_manager=TaskManager(include_path=folder, include_defaults=False))
    return seen


def test_compiled_once_the_requests_are_those_lm_eval_writes(utils, tmp_path, monkeypatch):
    from conftest import ROOT
    from ggbatch.runner.tools.lm_eval_templates import compile_templates_once

    for f in (ROOT / "tests" / "data" / "lm_eval").iterdir():
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)  # the task YAMLs name their data files relative to here
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = ["ggb_mc", "ggb_gen"]
    before = requests_of(tasks, str(tmp_path))
    assert compile_templates_once() and compile_templates_once()  # a second call keeps the first's cache
    compiled = utils.apply_template.compiled
    after = requests_of(tasks, str(tmp_path))
    assert after == before and before["loglikelihood"] and before["generate_until"]
    info = compiled.cache_info()
    # each template string compiled once: far fewer compiles than texts rendered
    assert 0 < info.misses < 20 < info.hits


def test_another_lm_evals_apply_template_is_left_alone(utils):
    from ggbatch.runner.tools.lm_eval_templates import compile_templates_once

    def apply_template(template: str, doc: dict, strict: bool = True) -> str:  # a changed signature
        return template

    utils.apply_template = apply_template
    assert not compile_templates_once()
    assert utils.apply_template is apply_template
