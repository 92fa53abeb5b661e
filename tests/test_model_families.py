"""The architectures users run, on tiny random-weight models from `ggbatch make-model`: qwen3
(QK-norm, a head size of its own), qwen3moe (a mixture of experts), gemma3 (a sliding window),
qwen35 (Qwen3.5: Gated DeltaNet and attention), mamba2 (recurrent), lfm2 (convolutions and
attention).

On each: greedy answers equal each prompt decoded alone in a fresh llama.cpp context, with no
worker restart, on plain prompts, a shared system prompt (taken whole, in part, or exactly) and
passages (the prefix cache's case); with --batch-invariant, answers identical at 1 slot and at
many, with the shared prefix and the prefix cache on and off, and across worker kills and a resume.
mamba2 and lfm2's engine-level checks are in tests/test_recurrent_models.py."""

from __future__ import annotations

import os
import signal
import subprocess
from array import array
from pathlib import Path

import gguf
import pytest

from conftest import ROOT
from ggbatch.runner.model.make import modelgen as mg
from ggbatch.runner.model.make.gemma3_gen import Gemma3Shape
from ggbatch.runner.model.make.qwen3_gen import Qwen3MoeShape
from ggbatch.runner.questions.prepare import common_prefix
from ggbatch.workers.engine.memory_kind import MemoryKind
from ggbatch.workers.protocol import Question
from helpers import (
    STORY_WORDS,
    alone,
    answers_after_starts,
    chat_questions,
    engine_answers,
    ggbatch_command,
    journal_entries,
    loaded_memory,
    passage_texts,
    repack_runs,
    wait_for,
    write_jsonl,
)

ATTENTION, RECURRENT, HYBRID = MemoryKind.ATTENTION, MemoryKind.RECURRENT, MemoryKind.HYBRID
# shape -> (architecture, memory as llama.cpp reports it, sliding window)
FAMILIES = {
    "qwen3-tiny": ("qwen3", ATTENTION, 0), "qwen3moe-tiny": ("qwen3moe", ATTENTION, 0),
    "gemma3-tiny": ("gemma3", ATTENTION, 16), "qwen35-tiny": ("qwen35", HYBRID, 0),
    "mamba2-tiny": ("mamba2", RECURRENT, 0), "lfm2-tiny": ("lfm2", HYBRID, 0),
}
NEW = ["qwen3-tiny", "qwen3moe-tiny", "gemma3-tiny", "qwen35-tiny"]
SYSTEM = "You answer questions about small stories in a few words, and you never say more than you know."
MAX_TOKENS = 10


def header(path: str) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("tokenizer.")}


# -- the files ----------------------------------------------------------------------------------


def test_each_family_has_its_own_tensors():
    specs = {name: dict(mg.ARCH_SHAPES[name].tensor_specs(100)) for name in FAMILIES}
    qwen3 = specs["qwen3-tiny"]
    assert qwen3["blk.0.attn_q.weight"] == (4 * 32, 64) and qwen3["blk.0.attn_q_norm.weight"] == (32,)
    moe = specs["qwen3moe-tiny"]
    assert moe["blk.1.ffn_gate_exps.weight"] == (8, 32, 64) and moe["blk.1.ffn_down_exps.weight"] == (8, 64, 32)
    assert moe["blk.1.ffn_gate_inp.weight"] == (8, 64) and "blk.1.ffn_gate.weight" not in moe
    gemma = specs["gemma3-tiny"]
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"} <= set(gemma)
    gemma_shape = mg.ARCH_SHAPES["gemma3-tiny"]
    assert isinstance(gemma_shape, Gemma3Shape) and gemma_shape.swa_layers() == [0]
    q35 = specs["qwen35-tiny"]  # DeltaNet in layers 0-2, attention (query and its gate) in layer 3
    assert q35["blk.0.attn_qkv.weight"] == (2 * 32 + 64, 64) and "blk.0.attn_q.weight" not in q35
    assert q35["blk.3.attn_q.weight"] == (2 * 4 * 16, 64) and "blk.3.ssm_a" not in q35
    with pytest.raises(ValueError, match="n_expert_used"):
        Qwen3MoeShape(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=64, n_ctx=64, n_expert=2,
                         n_expert_used=3, n_ff_exp=16)


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NEW)
def test_llama_cpp_loads_each_family_and_its_answer_reads_the_whole_prompt(arch_models, arch_tokenizers, name):

    arch, memory, window = FAMILIES[name]
    meta = header(arch_models[name])
    assert meta["general.architecture"] == arch
    if window:
        assert meta[f"{arch}.attention.sliding_window"] == window
    assert loaded_memory(arch_models[name]) == (memory, window)
    # The start of the prompt changes the answer, past the window too (the global layer sees it).
    end = " the girl ran to the big red house and the dog sat by the tree in the little blue garden"
    texts = answers_after_starts(arch_models[name], arch_tokenizers[name], end)
    assert len(texts) == 3, texts


# -- the engine ---------------------------------------------------------------------------------


def references(model: str, qs: list[Question], flash_attn: bool = True, repack: bool = True) -> dict[str, str]:
    """Each prompt's greedy answer decoded alone in a fresh context: llama-cpp-python's, whose
    weights are repacked; with repack=False one engine of one slot per prompt (llama-cpp-python
    cannot leave them plain), as a near-tie of a random model can go either way between the two."""
    if not repack:
        return {q.qid: engine_answers(model, [q], 1, array("i"), MAX_TOKENS, repack=False,
                                      flash_attn=flash_attn)[q.qid] for q in qs}
    return {q.qid: alone(model, q.tokens, MAX_TOKENS, flash_attn=flash_attn) for q in qs}


@pytest.mark.model
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NEW)
def test_engine_answers_as_alone_on_plain_shared_and_passage_prompts(arch_models, arch_tokenizers, name):
    model, tok, memory = arch_models[name], arch_tokenizers[name], FAMILIES[name][1]
    plain = chat_questions(tok, [f"Question {i}: what did the {w} do?" for i, w in enumerate(STORY_WORDS[:5])])
    with_system = chat_questions(tok, [f"What did the {w} do next?" for w in STORY_WORDS[6:10]], system=SYSTEM)
    system_prompt = array("i", common_prefix([q.tokens for q in with_system]))
    # Besides the prompts that hold all of the shared prefix, one that holds part of it and one
    # that is exactly it.
    partial = Question("partial", array("i", [*system_prompt[:len(system_prompt) // 2], *plain[0].tokens[1:]]), 90)
    shared = [*with_system, partial, Question("exact", array("i", system_prompt), 91)]
    passages = chat_questions(tok, passage_texts(3, 3))
    passage_prefix = array("i", common_prefix([q.tokens for q in passages]))
    # Passages without flash attention: its sums run over the KV cells in their order, which a
    # kept passage cut back and refilled changes, and a random model has near-ties (gemma3-tiny:
    # two tokens 0.0006 apart in one prompt of nine) that such a change flips either way.
    weights = dict(repack=memory is not HYBRID and repack_runs())  # as the plan lays them out
    want = {"plain": references(model, plain, **weights), "shared": references(model, shared, **weights),
            "passages": references(model, passages, flash_attn=False, **weights)}
    for slots in (1, 4):
        assert engine_answers(model, plain, slots, array("i"), MAX_TOKENS, **weights) == want["plain"]
        assert engine_answers(model, shared, slots, system_prompt, MAX_TOKENS, **weights) == want["shared"]
        stats: dict = {}
        got = engine_answers(model, passages, slots, passage_prefix, MAX_TOKENS, stats, kv_unified=False,
                             prefix_cache=True, flash_attn=False, **weights)
        assert got == want["passages"]
        assert stats["memory"] is memory
        # Attention memory cuts a kept passage back to where a question leaves it; recurrent
        # state cannot be cut, so there the prefix cache is off (workers/engine/memory_kind.py).
        assert (stats["prefix_hits"] > 0) is (memory is ATTENTION)


@pytest.mark.model
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_batch_invariant_answers_are_one_whatever_the_slots_prefix_and_cache(arch_models, arch_tokenizers, name):
    model, tok = arch_models[name], arch_tokenizers[name]
    qs = chat_questions(tok, passage_texts(2, 3, seed=5), system=SYSTEM)
    prefix = array("i", common_prefix([q.tokens for q in qs]))
    invariant = dict(kv_unified=False, flash_attn=False, repack=False, batch_invariant=True)
    runs = {(slots, shared, cache): engine_answers(model, qs, slots, prefix if shared else array("i"), MAX_TOKENS,
                                                   prefix_cache=cache, **invariant)
            for slots, shared, cache in [(1, False, False), (3, False, False), (3, True, False), (3, True, True),
                                         (1, True, True)]}
    first = runs[(1, False, False)]
    assert all(got == first for got in runs.values()), runs
    assert len(set(first.values())) > 1  # the answers depend on the prompt


# -- the whole job: worker kills and a resume -----------------------------------------------------


def run_command(model: str, questions: Path, out: Path, *extra: str) -> list[str]:
    return ggbatch_command("run", "--model", model, "--input", str(questions),
            "--output", str(out), "--workers", "1", "--max-tokens", "24", "--batch-invariant",
            "--system", SYSTEM, "--progress", "log", *extra)


def worker_pids(proc: subprocess.Popen) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(proc.pid).children()
                if any("spawn_main" in part for part in c.cmdline()) and not c.name().startswith("ggbatch-tok")]
    except psutil.NoSuchProcess:
        return []


def kill_when(proc: subprocess.Popen, out: Path, answers: int, pid_of) -> bool:
    """SIGKILL pid_of() once the journal holds `answers`; False if the job ended first."""
    wait_for(lambda: journal_entries(out) >= answers or proc.poll() is not None, what=f"{answers} answers")
    pid = pid_of()
    if proc.poll() is not None or pid is None:
        return False
    os.kill(pid, signal.SIGKILL)
    return True


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_job_with_worker_kills_and_a_resume_answers_as_a_quiet_one_slot_run(arch_models, name, tmp_path):
    rows = [{"questionID": f"r{i:02d}", "question": t} for i, t in enumerate(passage_texts(8, 6, seed=9))]
    questions = write_jsonl(tmp_path / "q.jsonl", rows)
    quiet = tmp_path / "quiet.json"
    done = subprocess.run(run_command(arch_models[name], questions, quiet, "--slots", "1", "--prefix-cache", "off"),
                          cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "disturbed.json"
    command = run_command(arch_models[name], questions, out, "--slots", "4")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: worker_pids(proc) or proc.poll() is not None, what="a live worker")
        killed_worker = kill_when(proc, out, 4, lambda: next(iter(worker_pids(proc)), None))
        killed_coordinator = kill_when(proc, out, 16, lambda: proc.pid)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert killed_worker and killed_coordinator, "the job ended before it could be killed: make it longer"
    resumed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert resumed.returncode == 0, resumed.stderr
    assert out.read_bytes() == quiet.read_bytes()


# -- hybrid models never get repacked weights -------------------------------------------------------


@pytest.mark.model
@pytest.mark.timeout(120)
def test_hybrid_models_are_found_from_their_header_and_never_repacked(arch_models):
    from ggbatch.runner.errors import ConfigError
    from ggbatch.runner.plan.repack import model_is_hybrid, repack_weights

    assert {name: model_is_hybrid(arch_models[name]) for name in FAMILIES} == {
        name: memory is HYBRID for name, (_, memory, _) in FAMILIES.items()}
    # not even when `ggbatch tune` measured repacked weights faster
    assert repack_weights(None, True, frozenset(), 4, hybrid=True) == (
        False, "hybrid model: repacked kernels mix its sequences")
    with pytest.raises(ConfigError, match="cannot be used with this hybrid model"):
        repack_weights(True, None, frozenset(), 4, hybrid=True)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, quant", [("qwen35-tiny", None), ("lfm2-tiny", None), ("qwen35-tiny", "q4_0")])
def test_a_default_job_on_a_hybrid_model_answers_as_one_slot_does(arch_models, name, quant, tmp_path):
    # With llama.cpp's repacked weights (its default, and ggbatch's below 16 slots on most CPUs)
    # these models mixed the sequences of a batch: at 4 slots no answer was the one-slot answer.
    # The Q4_0 file is one llama.cpp would repack, so the hybrid rule is what keeps it plain.
    from ggbatch.runner.model.make import modelgen as mg

    model = arch_models[name] if quant is None else str(mg.make_model(tmp_path / f"{name}-{quant}.gguf", name,
                                                                      quant=quant))
    rows = [{"questionID": f"q{i}", "question": f"Question {i}: what did the {w} do?"}
            for i, w in enumerate(STORY_WORDS[:8])]
    questions = write_jsonl(tmp_path / "q.jsonl", rows)
    answers = {}
    for slots in (1, 4):
        out = tmp_path / f"s{slots}.json"
        done = subprocess.run(ggbatch_command("run", "--model", model, "--input", questions, "--output",
                                              out, "--workers", 1, "--slots", slots, "--max-tokens", 12,
                                              "--progress", "off"),
                              cwd=ROOT, capture_output=True, text=True, timeout=200)
        assert done.returncode == 0, done.stderr
        # plain either way: for the hybrid rule, or (an f16 file) for having nothing llama.cpp repacks
        assert ("weights not repacked (hybrid model: repacked kernels mix its sequences)" in done.stdout
                or "weights not repacked (nothing to repack)" in done.stdout and quant is None), done.stdout
        answers[slots] = out.read_text()
    assert answers[4] == answers[1]
