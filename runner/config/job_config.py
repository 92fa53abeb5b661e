"""A job's settings, as build_config (runner/config/schema.py) makes them from its layers: every
key checked, `auto` held as AUTO (None) for the run to decide."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from ...workers.protocol import SamplingParams
from ..files.shards import Shard
from .checks import AUTO, FIRST_TOKEN


@dataclass(frozen=True)
class JobConfig:
    model: str = ""  # path to a GGUF file, or "demo" for the generated demo model
    input: str = ""
    output: str = ""
    report: Optional[str] = None
    input_format: Optional[str] = AUTO  # json, jsonl, csv or openai; auto: by extension and content
    shard: Optional[Shard] = None  # answer only this shard's questions (runner/files/shards.py)
    output_format: Optional[str] = AUTO  # json, jsonl, csv or openai; auto: runner/files/formats/detect.py
    errors_output: Optional[str] = None  # questions without an answer go here instead of output
    n_ctx: Optional[int] = AUTO  # context per sequence; auto = longest prompt + max_tokens
    workers: Optional[int] = AUTO
    threads: Optional[int] = AUTO
    threads_adapt: str = "auto"  # auto: fewer llama.cpp threads while other processes take the cores; off
    slots: Optional[int] = AUTO
    repack: Optional[bool] = AUTO  # llama.cpp's CPU_REPACK weight layout; auto: runner/plan/repack.py repack_weights
    n_gpu_layers: Optional[int] = AUTO  # layers in VRAM, GPU_ALL for all; auto: gpu.gpu_layers_for
    devices: tuple[int, ...] = ()  # one worker per GPU (runner/plan/gpu.py)
    n_batch: Optional[int] = AUTO  # a step's token budget; auto: layout.batch_budget
    max_tokens: int = 256
    system: Optional[str] = None
    prompt_template: Optional[str] = None  # Jinja over the record's fields -> the user message
    chat_template: str = "auto"  # "auto" (the model's own), "plain", or a Jinja chat template
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"enable_thinking": False}
    keep_thinking: bool = False  # also write a reasoning model's <think> block, as "thinking"
    thinking_budget: Optional[int] = None  # reasoning.max_tokens: thinking tokens before the end is forced
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    batch_invariant: bool = False  # answers independent of batch-mates (per-sequence KV, slower)
    # llama.cpp's flash attention; auto: on. Off, log-likelihoods agree with llama-cpp-python's own
    # to 1e-6 nats (on: to about 0.01 a token, its CPU kernel rounds K and V to F16); ggbatch.lm_eval turns it off,
    # and so does answer.choice_scoring: loglikelihood unless the job sets it.
    flash_attn: Optional[bool] = AUTO
    prefix_cache: str = "auto"  # "auto": prompts sharing a prefix are sent together and reuse its KV; "off"
    id_field: str = "questionID"
    question_field: str = "question"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # What an answer must be (runner/config/answer.py): one of fixed choices (or CHOICES_AUTO), JSON
    # under a schema (canonical JSON text), or a GBNF grammar; at most one of the three.
    choices: Union[tuple[str, ...], str] = ()
    choice_logprobs: bool = False  # write each choice's log-probability
    choice_logits: bool = True  # false: single-token choices generated under the grammar too
    # first_token, or loglikelihood: each choice scored as a continuation of the prompt (lm-eval's acc
    # and acc_norm picks, runner/questions/continuations.py)
    choice_scoring: str = FIRST_TOKEN
    token_logprobs: Optional[int] = None  # K: each answer token's log-probability and the K most likely
    json_schema: Optional[str] = None
    grammar: Optional[str] = None
    backend: str = "local"  # where workers live: local processes, or Ray actors (runner/pool/ray.py)
    ray_address: Optional[str] = None  # the Ray cluster to join (HOST:PORT or auto); None: start one here
    # key as a job file wrote it (model.path, sampling.n) -> that file, for the errors between keys
    # and the model's (runner/config/schema.py set_in_file)
    from_files: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
