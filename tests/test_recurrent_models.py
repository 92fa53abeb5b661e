"""Recurrent and hybrid memory (a pure `mamba2`, an `lfm2` hybrid of short convolutions and
attention): tiny random-weight models made by `ggbatch make-model`, and every greedy answer equal
to its prompt decoded alone in a fresh llama.cpp context, with no worker restart, on plain
questions, a shared system prompt that prompts share all or part of, and passages (the prefix
cache's case), at one slot and several.

llama.cpp cannot cut a recurrent state back to a position (seq_rm returns false), so there the
engine copies the shared prefix only whole and recomputes other prompts (workers/engine/memory_kind.py);
a refused removal raises instead of decoding from the wrong state."""

from __future__ import annotations

import json
import subprocess
from array import array
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import ROOT
from ggbatch.runner.model.make import modelgen as mg
from ggbatch.runner.questions.prepare import common_prefix
from ggbatch.workers.engine.memory_kind import KvRefused, MemoryKind
from ggbatch.workers.engine.prefix_cache import Start
from ggbatch.workers.engine.scheduler import Scheduler
from ggbatch.workers.engine.sequence import Sequence
from ggbatch.workers.protocol import Question
from helpers import (
    STORY_WORDS,
    alone,
    answers_after_starts,
    chat_questions,
    engine_answers,
    engine_run,
    ggbatch_command,
    loaded_memory,
    passage_texts,
    repack_runs,
)

ARCHS = {"mamba2-tiny": ("mamba2", MemoryKind.RECURRENT), "lfm2-tiny": ("lfm2", MemoryKind.HYBRID)}
WORDS = STORY_WORDS
SYSTEM = "You answer questions about small stories in a few words, and you never say more than you know."
MAX_TOKENS = 10


# -- the memory's rules, pure -------------------------------------------------------------------


def test_memory_kind_from_llama_cpp_flags_and_what_each_allows():
    assert MemoryKind.of(False, False) is MemoryKind.ATTENTION
    assert MemoryKind.of(True, False) is MemoryKind.RECURRENT
    assert MemoryKind.of(False, True) is MemoryKind.HYBRID  # llama.cpp: a hybrid is not "recurrent"
    assert MemoryKind.ATTENTION.start_len(7, 10) == 7 and MemoryKind.ATTENTION.prefix_cache
    for kind in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
        assert (kind.start_len(7, 10), kind.start_len(10, 10), kind.start_len(0, 10)) == (0, 10, 0)
        assert not kind.prefix_cache and kind.value in kind.note()
    assert MemoryKind.ATTENTION.note() == ""


def test_on_recurrent_memory_a_prompt_takes_the_shared_prefix_whole_or_not_at_all():
    prefix = array("i", range(1, 9))

    def start(memory: MemoryKind, prompt: list[int]) -> Start:
        sched = Scheduler(4, 64, prefix=prefix, memory=memory)
        sched.add(Sequence(Question("q", array("i", prompt), 0)))
        seq = sched.admit()[0]
        return Start(seq.source, seq.n_cached)

    longer, partial, exact = [*prefix, 50, 51], [*prefix[:5], 60, 61], list(prefix)
    attention = [start(MemoryKind.ATTENTION, p).n for p in (longer, partial, exact)]
    assert attention == [8, 5, 7]  # exactly the prefix: its last token is computed for its logits
    for memory in (MemoryKind.RECURRENT, MemoryKind.HYBRID):
        assert [start(memory, p).n for p in (longer, partial, exact)] == [8, 0, 0]
        assert start(memory, partial).source == -1


# -- the models ---------------------------------------------------------------------------------


def references(model: str, qs: list[Question], flash_attn: bool = True) -> dict[str, str]:
    return {q.qid: alone(model, q.tokens, MAX_TOKENS, flash_attn=flash_attn) for q in qs}


@pytest.mark.model
@pytest.mark.parametrize("name", list(ARCHS))
def test_make_model_writes_an_architecture_llama_cpp_loads_as_recurrent_memory(arch_models, arch_tokenizers, name,
                                                                              tmp_path):

    from ggbatch.runner.cli import build_parser
    from ggbatch.runner.tools.commands import cmd_make_model

    arch, kind = ARCHS[name]
    reader = gguf.GGUFReader(arch_models[name])
    field = reader.fields["general.architecture"]
    assert bytes(field.parts[field.data[0]]).decode() == arch
    assert loaded_memory(arch_models[name])[0] is kind
    # The answer depends on the start of the prompt: the state carries it (a test then sees a
    # wrong state in the text).
    texts = answers_after_starts(arch_models[name], arch_tokenizers[name],
                                 " the girl ran to the big red house and the dog sat by the tree")
    assert len(texts) == 3, texts
    out = tmp_path / "cli.gguf"
    assert cmd_make_model(build_parser().parse_args(["make-model", "--shape", name, str(out)])) == 0
    assert out.read_bytes() == Path(arch_models[name]).read_bytes()  # the same seed, the same bytes


def test_arch_shapes_tensor_lists_follow_llama_cpp():
    mamba, lfm = mg.ARCH_SHAPES["mamba2-tiny"], mg.ARCH_SHAPES["lfm2-tiny"]
    names = {n for n, _ in mamba.tensor_specs(100)}
    assert {"blk.0.ssm_in.weight", "blk.0.ssm_a", "blk.0.ssm_d", "blk.1.ssm_norm.weight"} <= names
    assert not any("attn_q" in n for n in names)
    specs = dict(lfm.tensor_specs(100))
    assert "blk.0.shortconv.conv.weight" in specs and "blk.1.attn_q.weight" in specs
    assert "blk.1.shortconv.in_proj.weight" not in specs and "output.weight" not in specs  # tied
    assert specs["blk.0.shortconv.in_proj.weight"] == (3 * lfm.n_embd, lfm.n_embd)
    assert specs["blk.1.attn_k.weight"] == (lfm.n_head_kv * lfm.head_dim, lfm.n_embd)


# -- the engine on them -------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(ARCHS))
def test_engine_answers_as_alone_on_plain_shared_and_passage_prompts(arch_models, arch_tokenizers, name):
    model, tok = arch_models[name], arch_tokenizers[name]
    plain = chat_questions(tok, [f"Question {i}: what did the {w} do?" for i, w in enumerate(WORDS[:6])])
    with_system = chat_questions(tok, [f"What did the {w} do next?" for w in WORDS[6:11]], system=SYSTEM)
    system_prompt = with_system[0].tokens[:len(common_prefix([q.tokens for q in with_system]))]
    # The system prompt decoded once as the shared prefix; besides the prompts that hold all of
    # it, one that shares only part of it and one that is exactly it.
    partial = Question("partial", array("i", [*system_prompt[:len(system_prompt) // 2], *plain[0].tokens[1:]]), 90)
    exact = Question("exact", array("i", system_prompt), 91)
    shared = [*with_system, partial, exact]
    passages = chat_questions(tok, passage_texts(4, 3))
    passage_prefix = array("i", common_prefix([q.tokens for q in passages]))  # as the coordinator finds it
    want = {"plain": references(model, plain), "shared": references(model, shared),
            "passages": references(model, passages)}
    weights = dict(repack=ARCHS[name][1] is not MemoryKind.HYBRID and repack_runs())  # as the plan lays them out
    for slots in (1, 4):
        assert engine_answers(model, plain, slots, array("i"), MAX_TOKENS, **weights) == want["plain"]
        stats: dict = {}
        assert engine_answers(model, shared, slots, system_prompt, MAX_TOKENS, stats, **weights) == want["shared"]
        # Copied whole into the prompts that go on past it; the other two computed from the start.
        assert stats["prompt_reused"] == len(system_prompt) * len(with_system)
        # Passages: the prefix cache as the coordinator asks for it (one stream per sequence).
        stats = {}
        got = engine_answers(model, passages, slots, passage_prefix, MAX_TOKENS, stats, kv_unified=False,
                             prefix_cache=True, **weights)
        assert got == want["passages"]
        assert stats["memory"] is ARCHS[name][1] and stats["prefix_hits"] == 0 and stats["kept_tokens_peak"] == 0


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(ARCHS))
def test_scored_continuations_fork_from_their_contexts_state(arch_models, arch_tokenizers, name):
    """A state cannot be cut back, so a question's continuations once each computed the context:
    now the others fork from the first one's state (copied whole) once the context but its last
    token is in. The context is computed once, and every sum is as with one slot, where each
    continuation computes it alone."""
    from ggbatch.workers.protocol import EngineConfig, GenerationParams

    model, tok = arch_models[name], arch_tokenizers[name]
    contexts = [tok.tokenize(" ".join(WORDS[(i + k) % len(WORDS)] for k in range(30))) for i in range(5)]
    continuations = tuple(tok.tokenize(f" the {w} ran home", add_bos=False) for w in WORDS[:4])
    qs = [Question(f"c{i}", ctx, 0, continuations=continuations) for i, ctx in enumerate(contexts)]

    def scored(slots: int, stats: dict) -> dict[str, list[float]]:
        config = EngineConfig(model_path=model, n_threads=1, slots=slots, n_ctx_seq=512, n_batch=256,
                              generation=GenerationParams(max_tokens=1),
                              kv_unified=False, flash_attn=False, repack=False)
        answers = engine_run(config, qs, stats)
        return {qid: [s.logprob for s in a.scored] for qid, a in answers.items()}

    forked, alone_ = {}, {}
    got, want = scored(8, forked), scored(1, alone_)
    assert got.keys() == want.keys()
    for qid, sums in got.items():
        assert sums == pytest.approx(want[qid], abs=1e-5)
    # each continuation: its tokens but the last, and the context's last
    own = sum(len(c) for c in continuations) * len(qs)
    assert forked["prompt_computed"] <= sum(len(c) - 1 for c in contexts) + own, forked["prompt_computed"]
    assert alone_["prompt_computed"] > 3 * sum(len(c) for c in contexts)  # the context once per continuation


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(ARCHS))
def test_batch_invariant_mode_on_recurrent_memory_answers_as_alone(arch_models, arch_tokenizers, name):
    model, tok = arch_models[name], arch_tokenizers[name]
    qs = chat_questions(tok, passage_texts(2, 3, seed=5), system=SYSTEM)
    prefix = array("i", common_prefix([q.tokens for q in qs]))
    want = references(model, qs, flash_attn=False)
    for slots in (1, 3):
        assert engine_answers(model, qs, slots, prefix, MAX_TOKENS, kv_unified=False, flash_attn=False, repack=False,
                          batch_invariant=True, prefix_cache=True) == want


@pytest.mark.model
@pytest.mark.timeout(60)
def test_a_refused_removal_raises_and_is_never_passed_over(arch_models):
    from ggbatch.workers.engine.step_counters import StepCounters
    from ggbatch.workers.llama.model_runner import ModelRunner
    from ggbatch.workers.llama.slot_kv import SlotKv

    runner = ModelRunner(arch_models["mamba2-tiny"], 1, n_ctx=256, n_seq_max=2, n_batch=64, kv_unified=False)
    try:
        n = 12
        assert runner.decode(np.arange(3, 3 + n, dtype=np.int32), np.arange(n, dtype=np.int32),
                             np.ones(n, np.int32), np.zeros(n, np.int8)) == 0
        assert runner.seq_rm(1, 5, -1) is False  # a recurrent state has no position 5 to cut at
        kv = SlotKv(runner, array("i", range(3, 3 + n)), 1, None, StepCounters())
        seq = Sequence(Question("q", array("i", [*range(3, 8), 40, 41]), 0))
        seq.admit(0, 5, 1)  # as if told to take 5 of the prefix's 12 tokens
        with pytest.raises(KvRefused, match="positions 5 and after of sequence 0 .recurrent memory"):
            kv.start(seq)
        with pytest.raises(KvRefused):
            kv.remove(1, 5)
        kv.remove(1)  # all of it: allowed
        assert runner.seq_rm(1, 0, -1) is True
    finally:
        runner.close()


# -- the whole job, in worker processes ----------------------------------------------------------


def ggbatch_run(model: str, questions: Path, out: Path, *extra: str) -> tuple[dict, str]:
    args = ggbatch_command("run", "--model", model, "--input", str(questions),
            "--output", str(out), "--report", f"{out}.report.json", "--workers", "1",
            "--max-tokens", str(MAX_TOKENS), "--progress", "off", *extra)
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    return json.loads(Path(f"{out}.report.json").read_text()), done.stderr


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(ARCHS))
def test_a_passage_job_with_a_system_prompt_answers_as_alone_with_no_restart(arch_models, arch_tokenizers, name,
                                                                             tmp_path):
    model, tok = arch_models[name], arch_tokenizers[name]
    texts = passage_texts(3, 4, seed=4, words=80)
    rows = [{"questionID": f"r{i}", "question": t} for i, t in enumerate(texts)]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    qs = chat_questions(tok, texts, system=SYSTEM)
    want = {f"r{i}": alone(model, q.tokens, MAX_TOKENS).strip() for i, q in enumerate(qs)}  # answers files strip
    for slots in ("1", "4"):
        out = tmp_path / f"a{slots}.json"
        report, stderr = ggbatch_run(model, questions, out, "--slots", slots, "--system", SYSTEM)
        assert {r["questionID"]: r["answer"].strip() for r in json.loads(out.read_text())} == want
        assert [w["restarts"] for w in report["workers"].values()] == [0]
        assert report["questions"]["failed"] == 0
        cache = report["prefix_cache"]
        assert cache["mode"] == "auto" and cache["groups"] == 3 and not cache["active"]
        assert cache["model_memory"] == ARCHS[name][1].value and cache["hits"] == 0
        assert stderr.count("prefix cache is off") == 1, stderr
