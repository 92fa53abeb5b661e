"""ggbatch: answer a whole file of questions with a local GGUF model, using every core.

    import ggbatch

    if __name__ == "__main__":  # workers are spawned processes
        report = ggbatch.run("jobs/example.yaml", max_tokens=64, output="a64.json")  # as `ggbatch run`
        report = ggbatch.run(model="m.gguf", input="q.jsonl", output="a.json", sampling={"temperature": 0})
        for a in ggbatch.answer(["What is 2+2?", "Name a prime."], model="m.gguf", max_tokens=32):
            print(a.id, a.text)

Names are loaded on first use, so that a worker process (which imports ggbatch.workers, and with
it this package) never loads the coordinator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_API = {
    "run": "ggbatch.runner.api",
    "answer": "ggbatch.runner.api",
    "Answered": "ggbatch.runner.api",
    "Pool": "ggbatch.runner.warm.pool",
    "PoolClosed": "ggbatch.runner.warm.pool_errors",
    "job_config": "ggbatch.runner.api",
    "RunReport": "ggbatch.runner.report.report",
    "GgbatchError": "ggbatch.runner.errors",
    # the lower layer: a JobConfig built from (source, {dotted key: value}) layers, run as is
    "JobConfig": "ggbatch.runner.config.schema",
    "build_config": "ggbatch.runner.config.schema",
    "load_job_file": "ggbatch.runner.config.job_file",
    "run_job": "ggbatch.runner.job",
}
__all__ = sorted(_API)

if TYPE_CHECKING:  # what a type checker and an editor see of the names _API loads on first use
    from .runner.api import Answered as Answered
    from .runner.api import answer as answer
    from .runner.api import job_config as job_config
    from .runner.api import run as run
    from .runner.config.job_file import load_job_file as load_job_file
    from .runner.config.schema import JobConfig as JobConfig
    from .runner.config.schema import build_config as build_config
    from .runner.errors import GgbatchError as GgbatchError
    from .runner.job import run_job as run_job
    from .runner.report.report import RunReport as RunReport
    from .runner.warm.pool import Pool as Pool
    from .runner.warm.pool_errors import PoolClosed as PoolClosed


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'ggbatch' has no attribute {name!r}")
