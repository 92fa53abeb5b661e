"""The checks between a job's keys (runner/config/schema.py's build_config runs them once the
layers are applied): settings each valid alone that do not hold together. Each raises KeysError
naming its keys, so the error names the job file that set them, as a key's own error does."""

from __future__ import annotations

from ..errors import KeysError
from .checks import LOGLIKELIHOOD
from .job_config import JobConfig


def check_between_keys(config: JobConfig) -> None:
    """KeysError, naming the keys, for settings that each pass their own check but not together."""
    given = [key for key, value in (("answer.choices", config.choices), ("answer.json_schema", config.json_schema),
                                    ("answer.grammar", config.grammar)) if value]
    if len(given) > 1:
        raise KeysError(f"{' and '.join(given)}: give one of them (an answer is one choice, JSON or a grammar's)",
                        given)
    if config.choice_logprobs and not config.choices:
        raise KeysError("answer.logprobs: needs answer.choices (log-probabilities are the choices')",
                        ("answer.logprobs", "answer.choices"))
    if config.choice_logprobs and not config.choice_logits and config.choice_scoring != LOGLIKELIHOOD:
        raise KeysError("answer.logprobs with answer.choice_logits: false: every answer is generated and no choice "
                        "has a log-probability; leave choice_logits on, or score the choices "
                        f"(answer.choice_scoring: {LOGLIKELIHOOD})", ("answer.logprobs", "answer.choice_logits"))
    if config.batch_invariant and config.flash_attn is True:  # auto runs it off there, without a word
        raise KeysError("flash_attn: true cannot be combined with batch_invariant: llama.cpp's flash attention "
                        "sums a row's softmax over as many KV cells as its batch scans, so the row's result "
                        "would depend on its batch", ("flash_attn", "batch_invariant"))
    _check_scoring(config)
    _check_samples(config)
    _check_backend(config)


def _check_scoring(config: JobConfig) -> None:
    """Log-likelihood scoring needs the choices it scores, and gives one answer per question, which
    no token is generated for."""
    if config.choice_scoring != LOGLIKELIHOOD:
        return
    if not config.choices:
        raise KeysError(f"answer.choice_scoring: {LOGLIKELIHOOD} scores each of answer.choices as a continuation "
                        "of the prompt: give answer.choices (--choices A,B,C,D or auto)", ("answer.choice_scoring",))
    if config.sampling.n > 1:
        raise KeysError(f"sampling.n: {config.sampling.n} samples with answer.choice_scoring: {LOGLIKELIHOOD} "
                        "would be the same scores: log-likelihoods are not sampled",
                        ("sampling.n", "answer.choice_scoring"))
    if config.token_logprobs is not None:
        raise KeysError(f"answer.token_logprobs: {config.token_logprobs} with answer.choice_scoring: "
                        f"{LOGLIKELIHOOD}: no token is generated; each choice's log-probability is "
                        "answer.logprobs (--choice-logprobs)", ("answer.token_logprobs", "answer.choice_scoring"))


def _check_samples(config: JobConfig) -> None:
    """n samples that could only be n copies of one answer are refused rather than computed."""
    n = config.sampling.n
    if n > 1 and config.sampling.temperature <= 0:
        raise KeysError(f"sampling.n: {n} samples need sampling.temperature > 0 (--temperature); greedy "
                        f"decoding would give {n} identical answers", ("sampling.n", "sampling.temperature"))
    if n > 1 and config.choices and config.choice_logits:
        raise KeysError(f"sampling.n: {n} samples of answer.choices answered from the logits would be "
                        "the same most likely choice: set answer.choice_logits: false to sample the choices",
                        ("sampling.n", "answer.choices", "answer.choice_logits"))


def _check_backend(config: JobConfig) -> None:
    """Settings that make sense with one backend only."""
    if config.ray_address is not None and config.backend != "ray":
        raise KeysError(f"ray_address: {config.ray_address} is for backend: ray (--backend ray), "
                        f"the backend is {config.backend}", ("ray_address", "backend"))
    if config.backend == "ray" and config.devices:
        raise KeysError("devices: GPUs are not laid out on the Ray backend (yet); use backend: local",
                        ("devices", "backend"))
