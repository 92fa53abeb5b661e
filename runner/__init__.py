"""ggbatch coordinator: reads a job, plans the layout, runs the worker pool, merges the answers."""

from runner.config import JobConfig, build_config, load_job_file


def run_job(config: JobConfig, **kwargs):  # noqa: ANN001, ANN201 - re-exported, typed in runner.job
    """Run a job and return its report dict. See runner.job.run_job."""
    from runner.job import run_job as _run_job

    return _run_job(config, **kwargs)


__all__ = ["JobConfig", "build_config", "load_job_file", "run_job"]
