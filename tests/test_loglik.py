"""Log-likelihood scoring in the engine (workers/engine/loglik.py): every continuation's token
log-probabilities as llama-cpp-python computes them one request at a time (`Llama(logits_all=True)`
over context + continuation), is_greedy the same, and a context shared by several continuations
computed once per worker."""

from array import array

import numpy as np
import pytest

from conftest import MODELS, STORIES, require
from ggbatch.workers.protocol import EngineConfig, GenerationParams, Question
from helpers import STORY_WORDS, answers_of, repack_runs

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]

TOLERANCE = 0.01  # nats, the bar against llama-cpp-python's own


def reference(model: str, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[list[float], bool]]:
    """Each (context, continuation)'s token log-probabilities and is_greedy, by llama-cpp-python
    evaluating context + continuation alone with logits for every position."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=512, n_batch=512, logits_all=True, verbose=False)
    out = []
    try:
        for context, cont in pairs:
            llm.reset()
            llm.eval(context + cont)
            rows = np.array(llm.scores[len(context) - 1:len(context) + len(cont) - 1], dtype=np.float64)
            top = rows.max(axis=1)
            log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
            picked = rows[np.arange(len(cont)), cont]
            out.append(((picked - log_z).tolist(), bool((rows.argmax(axis=1) == np.array(cont)).all())))
    finally:
        llm.close()
    return out


def story_pairs(tokenize, n_contexts: int = 6, per_context: int = 4, seed: int = 3) -> list[tuple[list, list]]:
    """Contexts of 40-odd words, each with several continuations of one to six words."""
    import random

    rng = random.Random(seed)
    pairs = []
    for _ in range(n_contexts):
        context = "Once upon a time " + " ".join(rng.choice(STORY_WORDS) for _ in range(40))
        for _ in range(per_context):
            cont = " " + " ".join(rng.choice(STORY_WORDS) for _ in range(rng.randint(1, 6)))
            whole, ctx = tokenize(context + cont), tokenize(context)
            pairs.append((list(ctx), list(whole[len(ctx):])))
    return pairs


def engine_scores(model: str, pairs, slots: int = 4, stats: dict | None = None, grouped: bool = False, **config):
    """Each pair's Scored from a LlamaEngine; `grouped`: a context's continuations in one question.
    Without flash attention, as the layout runs scoring (runner/plan/layout.py engine_config)."""
    from ggbatch.workers.llama.engine import LlamaEngine

    config.setdefault("flash_attn", False)
    config.setdefault("repack", repack_runs())  # a quantized model's weights as the plan lays them out
    engine = LlamaEngine(EngineConfig(model_path=model, n_threads=1, slots=slots, n_ctx_seq=512, n_batch=256,
                                      generation=GenerationParams(max_tokens=1),
                                      **config), worker_id=0)
    try:
        if grouped:
            contexts: dict[tuple, list[int]] = {}
            for i, (ctx, _) in enumerate(pairs):
                contexts.setdefault(tuple(ctx), []).append(i)
            qs = [Question(f"c{k}", array("i", ctx), 0, continuations=tuple(array("i", pairs[i][1]) for i in idx))
                  for k, (ctx, idx) in enumerate(contexts.items())]
            got = answers_of(engine, qs)
            out = [None] * len(pairs)
            for k, idx in enumerate(contexts.values()):
                for j, i in enumerate(idx):
                    out[i] = got[f"c{k}"].scored[j]
        else:
            qs = [Question(f"p{i}", array("i", ctx), 0, continuations=(array("i", cont),))
                  for i, (ctx, cont) in enumerate(pairs)]
            got = answers_of(engine, qs)
            assert all(a.error is None for a in got.values()), got
            out = [got[f"p{i}"].scored[0] for i in range(len(pairs))]
        if stats is not None:
            stats.update(engine.stats())
        return out
    finally:
        engine.close()


def tokenizer_of(model: str):
    from ggbatch.workers.llama.model_runner import Tokenizer

    return Tokenizer(model)


def assert_close(got, want) -> float:
    worst = 0.0
    for scored, (logprobs, greedy) in zip(got, want):
        assert len(scored.token_logprobs) == len(logprobs)
        worst = max([worst] + [abs(a - b) for a, b in zip(scored.token_logprobs, logprobs)])
        assert abs(scored.logprob - sum(logprobs)) < TOLERANCE
        assert scored.is_greedy == greedy
    assert worst < TOLERANCE, worst
    return worst


MODELS_TESTED = [STORIES, MODELS / "TinyStories-656K-Q8_0.gguf", MODELS / "llama-2-tiny-random.gguf"]


@pytest.mark.parametrize("path", MODELS_TESTED, ids=lambda p: p.stem)
def test_scores_match_llama_cpp_python_one_request_at_a_time(path):
    model = str(require(path, "a real GGUF model to score against llama-cpp-python"))
    tok = tokenizer_of(model)
    try:
        pairs = story_pairs(tok.tokenize)
    finally:
        tok.close()
    want = reference(model, pairs)
    # Alone, in a batch of separate streams with the prefix cache, in a unified pool, grouped.
    for config in ({"slots": 1}, {"prefix_cache": True, "kv_unified": False}, {"kv_unified": True},
                   {"grouped": True, "prefix_cache": True, "kv_unified": False}):
        assert_close(engine_scores(model, pairs, **config), want)


def test_demo_model_scores_match(demo_model):
    tok = tokenizer_of(demo_model)
    try:
        pairs = story_pairs(tok.tokenize, n_contexts=3)
    finally:
        tok.close()
    assert_close(engine_scores(demo_model, pairs, prefix_cache=True, kv_unified=False), reference(demo_model, pairs))


def test_greedy_continuation_is_greedy(stories):
    """A continuation made of the model's own greedy tokens is is_greedy; one token changed is not."""
    from llama_cpp import Llama

    tok = tokenizer_of(stories)
    ctx = list(tok.tokenize("Once upon a time there was a little girl"))
    tok.close()
    llm = Llama(model_path=stories, n_ctx=256, verbose=False)
    greedy = []
    for token in llm.generate(ctx, temp=0.0):
        greedy.append(token)
        if len(greedy) == 5:
            break
    llm.close()
    other = greedy[:-1] + [(greedy[-1] + 1) % 512]
    got = engine_scores(stories, [(ctx, greedy), (ctx, other)], prefix_cache=True, kv_unified=False)
    assert got[0].is_greedy and not got[1].is_greedy
    assert got[0].logprob > got[1].logprob


def test_a_shared_context_is_computed_once(stories):
    """Six contexts × four continuations on one worker: each context goes through the model once,
    then each continuation costs its own tokens and the context's last one."""
    tok = tokenizer_of(stories)
    pairs = story_pairs(tok.tokenize)
    tok.close()
    stats: dict = {}
    engine_scores(stories, pairs, slots=4, stats=stats, prefix_cache=True, kv_unified=False)
    contexts = {tuple(ctx) for ctx, _ in pairs}
    once = sum(len(c) for c in contexts) + sum(len(cont) + 1 for _, cont in pairs)
    every = sum(len(ctx) + len(cont) for ctx, cont in pairs)
    assert stats["prompt_computed"] <= once + 4 * len(contexts), (stats["prompt_computed"], once, every)
    assert stats["prompt_computed"] < every / 2


def test_a_questions_context_is_computed_once_however_many_questions_wait(stories):
    """Twenty questions of four continuations of several tokens each, as many slots, a step
    computing a few contexts: a question's continuations wait behind its first one and take the
    context it leaves in its slot, and no other question's copy takes that slot meanwhile (which
    once made such a run compute its contexts 1.5-2 times over)."""
    import random

    rng = random.Random(5)
    tok = tokenizer_of(stories)
    pairs = []
    for _ in range(20):
        context = list(tok.tokenize(" ".join(rng.choice(STORY_WORDS) for _ in range(90))))
        pairs += [(context, list(tok.tokenize(" " + " ".join(rng.choice(STORY_WORDS) for _ in range(3)),
                                              add_bos=False))) for _ in range(4)]
    tok.close()
    stats: dict = {}
    engine_scores(stories, pairs, slots=20, stats=stats, grouped=True, prefix_cache=True, kv_unified=False)
    contexts = {tuple(ctx) for ctx, _ in pairs}
    once = sum(len(c) for c in contexts) + sum(len(cont) + 1 for _, cont in pairs)
    assert stats["prompt_computed"] <= once, (stats["prompt_computed"], once)


@pytest.mark.parametrize("slots, context, continuations", [
    (1, [1], ([5, 6, 7], [8, 9])),  # a context of one token: nothing to start from, nothing to fork
    (1, [1, 30, 40], ([5, 6, 7], [8, 9])),
    (2, [1, 30, 40], ([5, 6, 7], [8, 9], [10, 11], [12, 13])),
    (3, [1, 30, 40], ([5, 6, 7], [8, 9], [10, 11], [12, 13])),
])
def test_questions_on_one_context_are_all_answered_whatever_the_slots(stories, slots, context, continuations):
    """Two questions on the same context, more continuations than slots: a free slot keeping a
    context was held for continuations that would never start from it, and with nothing running
    the engine waited for good (lm-eval's rolling windows at slots=1: every first window is BOS)."""
    from ggbatch.workers.llama.engine import LlamaEngine

    engine = LlamaEngine(EngineConfig(model_path=stories, n_threads=1, slots=slots, n_ctx_seq=128, n_batch=64,
                                      generation=GenerationParams(max_tokens=1),
                                      kv_unified=False, flash_attn=False, prefix_cache=True, repack=False), 0)
    try:
        for k in range(2):
            engine.add(Question(f"q{k}", array("i", context), 0,
                                continuations=tuple(array("i", c) for c in continuations)))
        got = {}
        for _ in range(100):
            got.update((a.qid, a) for a in engine.step())
            if not engine.n_unfinished:
                break
        assert sorted(got) == ["q0", "q1"] and all(a.error is None for a in got.values()), engine.sched.waiting
        assert got["q0"].scored == got["q1"].scored
    finally:
        engine.close()


def letter_pairs(model: str, n_contexts: int = 5) -> list[tuple[list, list]]:
    """MMLU's shape: contexts each with four one-token continuations, the first of them the
    context's greedy next token (so is_greedy is seen true as well as false)."""
    tok = tokenizer_of(model)
    try:
        contexts = [c for c, _ in story_pairs(tok.tokenize, n_contexts=n_contexts, per_context=1)]
    finally:
        tok.close()
    greedy = [scores[0] for scores in reference_next(model, contexts)]
    others = [[t for t in (11, 29, 97, 131) if t != g][:3] for g in greedy]
    return [(ctx, [token]) for ctx, g, rest in zip(contexts, greedy, others) for token in [g] + rest]


def reference_next(model: str, contexts: list[list[int]]) -> list[list[int]]:
    """Each context's greedy next token (in a list), by llama-cpp-python."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=512, logits_all=True, verbose=False)
    try:
        out = []
        for ctx in contexts:
            llm.reset()
            llm.eval(ctx)
            out.append([int(np.argmax(llm.scores[len(ctx) - 1]))])
        return out
    finally:
        llm.close()


def test_one_token_continuations_are_read_from_the_context_row(stories):
    """Four one-token continuations of a context cost one token beyond the context: one sequence,
    the context and the first letter, reads them all from the context's last row, and they score
    as llama-cpp-python scores each alone; a context of one token (lm-eval's BOS for an empty one)
    too, batch-invariant mode included."""
    pairs = letter_pairs(stories)
    pairs += [(pairs[0][0][:1], [t]) for t in (5, 9, 13, 17)]
    want = reference(stories, pairs)
    stats: dict = {}
    got = engine_scores(stories, pairs, stats=stats, grouped=True, prefix_cache=True, kv_unified=False)
    assert_close(got, want)
    assert [s.is_greedy for s in got[:4]] == [True, False, False, False]
    assert stats["prompt_computed"] <= sum(len(ctx) + 1 for ctx, _ in pairs[::4]), stats["prompt_computed"]
    invariant = {"batch_invariant": True, "kv_unified": False, "repack": False, "prefix_cache": True}
    assert_close(engine_scores(stories, pairs, grouped=True, **invariant), want)


def test_one_token_and_longer_continuations_of_one_context(stories):
    """A context whose continuations are of one token and of several: the one-token ones ride on
    the first longer one's sequence, every score as llama-cpp-python's."""
    tok = tokenizer_of(stories)
    try:
        long_pairs = story_pairs(tok.tokenize, n_contexts=3, per_context=2, seed=5)
    finally:
        tok.close()
    pairs = []
    for k in range(0, len(long_pairs), 2):
        ctx = long_pairs[k][0]
        pairs += [(ctx, [7]), long_pairs[k], (ctx, [42]), long_pairs[k + 1]]
    assert all(len(cont) > 1 for _, cont in long_pairs)
    want = reference(stories, pairs)
    for config in ({"slots": 1}, {"slots": 4, "prefix_cache": True, "kv_unified": False}):
        assert_close(engine_scores(stories, pairs, grouped=True, **config), want)


def test_a_continuation_too_long_fails_alone(stories):
    from ggbatch.workers.llama.engine import LlamaEngine

    engine = LlamaEngine(EngineConfig(model_path=stories, n_threads=1, slots=2, n_ctx_seq=64, n_batch=64,
                                      generation=GenerationParams(max_tokens=1),
                                      kv_unified=False), worker_id=0)
    try:
        got = answers_of(engine, [Question("long", array("i", [1] * 40), 0, continuations=(array("i", [5] * 30),)),
                                  Question("empty", array("i"), 0, continuations=(array("i", [5]),)),
                                  Question("ok", array("i", [1, 5, 6]), 0, continuations=(array("i", [7, 8]),))])
    finally:
        engine.close()
    assert "context per sequence is 64" in got["long"].error
    assert "context of one token or more" in got["empty"].error
    assert got["ok"].error is None and len(got["ok"].scored[0].token_logprobs) == 2


@pytest.mark.timeout(60)
def test_a_continuation_whose_last_token_is_a_step_of_its_own_is_answered():
    """With a step budget of 256 tokens, 254 of context and 3 of continuation leave the last token
    alone in the second step: that step reads no row, yet the question is done there."""
    model = str(require(STORIES, "stories260K"))
    tok = tokenizer_of(model)
    try:
        story = list(tok.tokenize("Once upon a time " + " ".join(STORY_WORDS * 40)))
        cont = list(tok.tokenize(" the little dog", add_bos=False))[:3]
    finally:
        tok.close()
    pairs = [(story[:254], cont)]
    assert len(pairs[0][0]) + len(cont) == 257
    assert_close(engine_scores(model, pairs, slots=1), reference(model, pairs))


@pytest.mark.timeout(120)
def test_a_one_token_context_with_one_token_continuations_in_batch_invariant_mode(stories):
    """lm-eval's empty context is BOS alone: with one-token continuations its prompt must not be
    a single token, which batch-invariant mode lays out as a decode step (ballast sequences in
    the slots of the prompts beside it). Scored beside questions on a shared prefix, it scores
    as without the mode."""
    from ggbatch.workers.llama.engine import LlamaEngine

    prefix = array("i", [1] + list(range(100, 120)))
    qs = [Question("bos", array("i", [1]), 0, continuations=(array("i", [7]), array("i", [9])))]
    qs += [Question(f"q{k}", prefix + array("i", range(200 + k, 230 + k)), 0, continuations=(array("i", [5, 6]),))
           for k in range(3)]
    scores = {}
    for invariant in (False, True):
        engine = LlamaEngine(EngineConfig(model_path=stories, n_threads=1, slots=4, n_ctx_seq=512, n_batch=256,
                                          prefix_tokens=prefix, generation=GenerationParams(max_tokens=1),
                                          flash_attn=False, batch_invariant=invariant, kv_unified=False,
                                          repack=not invariant), worker_id=0)
        try:
            got = answers_of(engine, qs)
        finally:
            engine.close()
        assert all(a.error is None for a in got.values()), got
        scores[invariant] = {qid: [s.logprob for s in a.scored] for qid, a in got.items()}
    for qid, want in scores[False].items():
        assert scores[True][qid] == pytest.approx(want, abs=1e-3)
