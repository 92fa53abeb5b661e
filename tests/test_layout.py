import json
import os
from array import array

import pytest

from ggbatch.runner.errors import ConfigError
from ggbatch.runner.plan.layout import (
    context_per_sequence,
    kv_unified_for,
    past_training_context,
    plan_layout,
    start,
)
from ggbatch.runner.plan.repack import cpu_flags, repack_weights
from ggbatch.runner.questions.maker import question_seed
from ggbatch.runner.questions.prepare import common_prefix
from helpers import ggbatch, write_questions


def test_auto_uses_one_worker_on_every_core():
    layout = plan_layout([0, 1, 2, 3], n_questions=100)
    assert (layout.workers, layout.threads, layout.cores) == (1, 4, ((0, 1, 2, 3),))


def test_workers_split_cores_disjointly():
    layout = plan_layout([2, 3, 5, 7], workers=2, slots=4, n_questions=10)
    assert layout.threads == 2
    assert layout.cores == ((2, 3), (5, 7))
    flat = [c for cores in layout.cores for c in cores]
    assert len(flat) == len(set(flat))


def test_threads_given_derives_workers():
    assert plan_layout([0, 1, 2, 3], threads=2, slots=1, n_questions=10).workers == 2


@pytest.mark.parametrize("workers,threads,message", [
    (3, None, "3 workers need at least 3 cores"),
    (None, 4, "4 threads per worker exceed"),
    (2, 2, "exceeds the 2 cores usable here"),
])
def test_never_more_threads_than_cores(workers, threads, message):
    with pytest.raises(ConfigError, match=message):
        plan_layout([0, 1], workers=workers, threads=threads, n_questions=10)


@pytest.mark.parametrize("workers,threads,message", [
    (2, None, "workers: 2 workers need at least 2 cores, 1 is usable here"),
    (None, 2, "threads: 2 threads per worker exceed the 1 core usable here"),
])
def test_one_core_is_said_in_the_singular(workers, threads, message):
    """A one-core container was told `1 are usable` and `the 1 cores usable`."""
    with pytest.raises(ConfigError) as err:
        plan_layout([0], workers=workers, threads=threads, n_questions=10)
    assert str(err.value) == message


@pytest.mark.model
@pytest.mark.timeout(120)
def test_too_many_workers_or_threads_from_a_job_file_name_the_file(tmp_path, demo_model):
    """Checked against the cores once the job is built, they named the key alone, where the key's
    own check (workers: 0) names the file; a flag that replaces the file's key names none."""
    n = len(os.sched_getaffinity(0)) + 1
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n')
    job = tmp_path / "j.yaml"
    for setting, said in ((f"workers: {n}", f"workers: {n} workers need at least {n} cores"),
                          (f"threads: {n}", f"threads: {n} threads per worker exceed the")):
        job.write_text(f"model: {demo_model}\ninput: q.jsonl\noutput: a.jsonl\n{setting}\n")
        done = ggbatch("run", job, "-q")
        assert done.returncode == 2 and done.stderr.startswith(f"ggbatch: error: {job}: {said}"), done.stderr
    done = ggbatch("run", job, "-q", "--threads", n)
    assert done.returncode == 2 and done.stderr.startswith(f"ggbatch: error: threads: {n} threads"), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.yaml", "q.jsonl"]


def test_a_step_holds_a_token_for_every_sequence_the_context_holds():
    from ggbatch.workers.engine.invariant import step_budget

    # the slots and the shared prefix's stream: llama.cpp aborts when they outnumber n_ubatch
    assert step_budget(8, slots=8, invariant=False) == 9
    assert step_budget(512, slots=8, invariant=False) == 512
    assert step_budget(16, slots=16, invariant=True) == 17
    assert step_budget(4, slots=2, invariant=False) == 4
    # batch-invariant prompt chunks take 2 MIN_ROWS (16), more than the MIN_ROWS + 1 streams
    assert step_budget(4, slots=2, invariant=True) == 16


@pytest.mark.model
@pytest.mark.timeout(300)
@pytest.mark.parametrize("flags,n_batch", [(("--slots", 8, "--n-batch", 8), 9), (("--n-batch", 16), None),
                                           (("--batch-invariant", "--slots", 16, "--n-batch", 16), 17),
                                           (("--batch-invariant", "--slots", 2, "--n-batch", 4), 16)])
def test_n_batch_at_or_below_the_slots_runs_and_the_report_says_the_budget_that_ran(tmp_path, demo_model,
                                                                                     flags, n_batch):
    """They aborted every worker with llama.cpp's GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max);
    under batch_invariant the report said n_batch 4 where the engine took 16 a step."""
    write_questions(tmp_path / "q.jsonl", 40)
    done = ggbatch("run", "--model", demo_model, "--input", tmp_path / "q.jsonl", "--output", tmp_path / "a.jsonl",
                   "--max-tokens", 2, "-q", "--report", tmp_path / "r.json", *flags, timeout=240)
    assert done.returncode == 0, done.stderr
    layout = json.loads((tmp_path / "r.json").read_text())["layout"]
    assert layout["n_batch"] == (n_batch or max(16, layout["slots_per_worker"] + 1)), layout
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 40


def test_auto_slots_never_exceed_questions_per_worker():
    assert plan_layout([0, 1], workers=2, threads=1, n_questions=5).slots == 3
    assert plan_layout([0, 1], workers=1, threads=2, n_questions=1000).slots == 64
    assert plan_layout([0, 1], workers=1, threads=2, n_questions=1000, max_auto_slots=16).slots == 16  # a tuned bound


def test_auto_slots_shrink_for_long_sequences_in_a_unified_pool():
    assert plan_layout([0, 1], workers=1, threads=2, n_questions=1000, pool_cells_per_slot=100).slots == 64
    assert plan_layout([0, 1], workers=1, threads=2, n_questions=1000, pool_cells_per_slot=500).slots == 16
    assert plan_layout([0, 1], workers=1, threads=2, n_questions=1000,
                       pool_cells_per_slot=4000).slots == 4  # never below 4
    assert plan_layout([0, 1], workers=1, threads=2, slots=8, n_questions=1000,
                       pool_cells_per_slot=4000).slots == 8  # as asked


def test_context_fits_longest_prompt_capped_by_model():
    assert context_per_sequence(300, 64, 2048, None) == 365
    assert context_per_sequence(3000, 64, 2048, None) == 2048
    assert context_per_sequence(3000, 64, 0, None) == 3065  # unknown training context
    assert context_per_sequence(300, 64, 2048, 1024) == 1024


def test_a_context_asked_past_the_training_context_is_warned_of():
    assert past_training_context(2048, 8192) == (
        "model.n_ctx: 8192 is more than the 2048 tokens of context the model was trained for: past 2048 tokens its "
        "answers may be garbage, unless it was made to stretch its context")
    assert past_training_context(2048, 2048) is None and past_training_context(2048, None) is None
    assert past_training_context(0, 8192) is None  # the training context is unknown


def test_a_max_tokens_no_context_can_hold_is_warned_of():
    from ggbatch.runner.plan.layout import max_tokens_past_context

    said = max_tokens_past_context(100_000_000, 2048, None)
    assert said is not None and "max_tokens: 100000000 is more than a sequence's whole context (2048 tokens, " \
        "the model's training context)" in said
    assert "(512 tokens, model.n_ctx)" in (max_tokens_past_context(512, 2048, 512) or "")
    assert max_tokens_past_context(2047, 2048, None) is None  # room for a prompt of one token
    assert max_tokens_past_context(10**8, 0, None) is None  # no limit known


def test_a_questions_own_max_tokens_past_the_context_is_said_of_that_question():
    """An OpenAI Batch line's body.max_tokens is its own: the warning names the line's id."""
    from ggbatch.runner.questions.prepare import max_tokens, most_said_by
    from ggbatch.workers.protocol import GenerationParams, Question

    job = GenerationParams(max_tokens=16)
    questions = [Question("a", array("i", [1]), 0), Question("big", array("i", [1]), 0, GenerationParams(100_000))]
    most = max_tokens(questions, job)
    assert most_said_by(questions, job, most) == "question 'big': body.max_tokens (its own max_tokens)"
    assert most_said_by(questions[:1], job, max_tokens(questions[:1], job)) == "max_tokens"


def test_common_prefix():
    a = array("i", [1, 2, 3, 4])
    assert common_prefix([a, array("i", [1, 2, 9]), array("i", [1, 2, 3])]).tolist() == [1, 2]
    assert common_prefix([a, array("i", [5])]).tolist() == []
    assert common_prefix([a]).tolist() == [1, 2, 3, 4]
    assert common_prefix([]).tolist() == []


def test_question_seed_depends_on_job_seed_and_id_only():
    assert question_seed(0, "q1") == question_seed(0, "q1")
    assert question_seed(0, "q1") != question_seed(1, "q1")
    assert question_seed(0, "q1") != question_seed(0, "q2")


def test_unified_kv_only_for_a_long_shared_prefix():
    assert kv_unified_for(545, 735, batch_invariant=False)  # W2: 545 shared of 735
    assert not kv_unified_for(15, 181, batch_invariant=False)  # W1: short system prompt
    assert not kv_unified_for(545, 735, batch_invariant=True)
    # scored continuations keep a stream each: in one pool their log-probabilities move with the batch
    assert not kv_unified_for(545, 735, batch_invariant=False, scored=True)


@pytest.mark.parametrize("longest,prefix,unified,slots", [(163, 10, False, 64), (1743, 1100, True, 8192 // 900)])
def test_long_sequences_keep_every_slot_with_one_stream_per_sequence(longest, prefix, unified, slots):
    # 420 tokens a sequence, 10 shared: one stream per sequence, whose attention never scans
    # another slot, so only memory limits the slots. 2,000 a sequence, 1,100 shared: one unified
    # pool, 900 cells a slot beyond the prefix, and 8192 pool cells hold 9 of them.
    from ggbatch.runner.plan.layout import PromptFacts, settle
    from ggbatch.runner.plan.memory import ModelDims

    dims = ModelDims(400 << 20, 28, 1024, 16, 8, 64, 151936, 3072)
    started = plan_layout([0, 1], slots=1, n_questions=1)
    layout, memory = settle(started, PromptFacts(1000, longest, prefix, 0, dims), max_tokens=256, n_batch=512,
                            available=64 << 30)
    assert layout.kv_unified is unified
    assert layout.n_ctx_seq == longest + 256 + 1
    assert layout.slots == memory.slots == slots
    assert layout.n_batch == 512


def test_scored_questions_keep_a_stream_each_under_a_long_shared_prefix():
    from ggbatch.runner.plan.layout import PromptFacts, settle
    from ggbatch.runner.plan.memory import ModelDims

    dims = ModelDims(400 << 20, 28, 1024, 16, 8, 64, 151936, 3072)
    started = plan_layout([0, 1], slots=1, n_questions=1)
    for scored, unified in [(False, True), (True, False)]:
        layout, _ = settle(started, PromptFacts(100, 1743, 1100, 0, dims, scored=scored), max_tokens=8, n_batch=512,
                           available=64 << 30)
        assert layout.kv_unified is unified


def test_auto_n_batch_is_larger_for_the_prefix_cache_and_an_asked_one_is_kept():
    from ggbatch.runner.plan.layout import PromptFacts, batch_budget, settle
    from ggbatch.runner.plan.memory import ModelDims

    assert batch_budget(None, False, False) == 512
    assert batch_budget(None, True, False) == 1024  # a passage's whole prompt in one ubatch
    assert batch_budget(None, True, True) == 512  # batch-invariant shapes are laid out for 512
    assert batch_budget(256, True, False) == 256
    dims = ModelDims(400 << 20, 28, 1024, 16, 8, 64, 151936, 3072)
    started = plan_layout([0, 1], slots=1, n_questions=1)
    grouped = PromptFacts(64, 800, 17, 0, dims, shared_groups=10)
    for asked, want in [(None, 1024), (512, 512)]:
        layout, _ = settle(started, grouped, max_tokens=32, n_batch=asked, available=64 << 30)
        assert (layout.prefix_cache, layout.n_batch) == (True, want)
    layout, _ = settle(started, PromptFacts(64, 800, 17, 0, dims), max_tokens=32, available=64 << 30)
    assert (layout.prefix_cache, layout.n_batch) == (False, 512)


def test_flash_attention_on_auto_is_off_on_a_cpu_up_to_its_context_bound():
    from dataclasses import replace

    from ggbatch.runner.plan.attention import CPU_MAX_CONTEXT, flash_attn_for
    from ggbatch.runner.plan.layout import PromptFacts, settle
    from ggbatch.runner.plan.memory import MIB, ModelDims

    assert flash_attn_for(None, 0, CPU_MAX_CONTEXT) is False  # a CPU: its kernel decodes slower
    assert flash_attn_for(None, 0, CPU_MAX_CONTEXT + 1) is True  # long prompts: llama.cpp's choice
    assert flash_attn_for(None, 28, 512) is True  # layers on a GPU
    assert flash_attn_for(True, 0, 512) is True and flash_attn_for(False, 28, 512) is False  # as asked
    dims = ModelDims(400 << 20, 28, 1024, 16, 8, 64, 151936, 3072)
    started = plan_layout([0, 1], slots=1, n_questions=1)
    facts = PromptFacts(2, 3444 - 4, 13, 0, dims)
    plain, plain_memory = settle(started, facts, slots=2, max_tokens=4, n_batch=512, available=64 << 30)
    flash, flash_memory = settle(replace(started, flash_attn=True), facts, slots=2, max_tokens=4, n_batch=512,
                                 available=64 << 30)
    assert (plain.flash_attn, flash.flash_attn) == (False, True)
    # Without it a prompt step writes 512 tokens x 3,584 cells x 16 heads of f32 scores (and part
    # of their softmax): 2 slots of 3,444 tokens measured 143 MiB more PSS than with it.
    extra = (plain_memory.compute_per_worker - flash_memory.compute_per_worker) / MIB
    assert 143 <= extra <= 200
    invariant = replace(started, batch_invariant=True, flash_attn=True)
    assert settle(invariant, facts, slots=2, max_tokens=4, n_batch=512, available=64 << 30)[0].flash_attn is False
    # --gpu-layers on a build that cannot offload keeps every layer on the CPU: off, as with none
    asked_gpu = replace(started, n_gpu_layers=28)
    for offload in (False, True):  # asked for, it is on where the build can offload
        assert settle(asked_gpu, facts, slots=2, max_tokens=4, n_batch=512, available=64 << 30,
                      offload=offload)[0].flash_attn is offload


def test_a_tuned_slot_count_is_the_cap_of_auto_slots():
    started = start([0, 1], n_records=1000, flags=frozenset(), tuned={"workers": 2, "threads": 1, "slots": 16,
                                                                       "repack": False})
    assert (started.workers, started.threads, started.slots, started.slot_cap) == (2, 1, 16, 16)
    assert (started.repack, started.repack_reason) == (False, "ggbatch tune")


def test_repack_weights_job_then_tune_then_cpu_and_batch():
    avx512 = frozenset({"sse2", "avx2", "avx512f"})
    assert repack_weights(True, False, avx512, 64) == (True, "job")  # the job's word is final
    assert repack_weights(None, True, avx512, 64) == (True, "ggbatch tune")  # then what tune measured
    assert repack_weights(None, None, avx512, 16) == (False, "auto: AVX-512 CPU, 16+ sequences per worker")
    assert repack_weights(None, None, avx512, 15) == (True, "auto: llama.cpp default")  # few sequences
    assert repack_weights(None, None, frozenset({"avx2", "fma"}), 64) == (True, "auto: llama.cpp default")
    assert repack_weights(None, None, frozenset({"neon", "asimd"}), 64) == (True, "auto: llama.cpp default")


def test_batch_invariant_never_repacks():
    # llama.cpp's repacked kernels give a row another result in another batch (gemm for groups
    # of 4 rows, gemv for the rest).
    assert repack_weights(None, True, frozenset({"neon"}), 4, batch_invariant=True) == (False, "batch_invariant")
    assert repack_weights(False, None, frozenset(), 4, batch_invariant=True) == (False, "batch_invariant")
    with pytest.raises(ConfigError, match="model.repack: true cannot be combined with batch_invariant"):
        repack_weights(True, None, frozenset(), 4, batch_invariant=True)


def test_a_cpu_that_refuses_repacked_kernels_never_repacks():
    why = "llama.cpp's repacked kernels stop this CPU (SIGILL)"
    assert repack_weights(None, True, frozenset({"avx512f"}), 4, refused=why) == (False, why)  # over tune's word
    with pytest.raises(ConfigError, match=r"model.repack: true: llama.cpp's repacked kernels stop this CPU \(SIGILL\)"):
        repack_weights(True, None, frozenset(), 4, refused=why)


def test_cpu_flags_are_read_from_this_machine():
    flags = cpu_flags()
    assert isinstance(flags, frozenset)
    if os.path.exists("/proc/cpuinfo") and os.uname().machine == "x86_64":
        assert "sse2" in flags  # every x86-64 CPU has it
