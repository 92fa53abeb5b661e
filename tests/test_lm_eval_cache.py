"""lm-eval's cache (--use_cache) as ggbatch's backend fills it: each answer as it comes, not when
the whole call returns, so an evaluation stopped halfway (a killed job, a full day's MMLU) keeps
what it answered and the rerun asks only the rest. Real lm-eval, a real model."""

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]


@pytest.fixture(scope="module")
def lm():
    pytest.importorskip("lm_eval", reason="lm-eval is the optional extra ggbatch[eval]: pip install 'ggbatch[eval]'")
    from conftest import STORIES, require
    from ggbatch.lm_eval import GgbatchLM

    model = GgbatchLM(model=str(require(STORIES, "stories260K")), workers=1, threads=1, slots=2)
    yield model
    model.pool.close()


def test_each_answer_is_in_lm_evals_cache_before_the_call_returns(lm, tmp_path):
    """Called directly, not through CachingLM (which writes a call's results once it returns): the
    cache holds every request's result all the same, written through lm-eval's cache hook."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.model import CachingLM, hash_args

    caching = CachingLM(lm, str(tmp_path / "cache.db"))  # sets its hook on lm
    ctx = "Once upon a time there was a little"
    scored = [Instance("loglikelihood", {}, (ctx, c), i) for i, c in enumerate((" girl", " dog", " cat"))]
    scored.append(Instance("loglikelihood", {}, ("The sun", " was hot"), 3))
    generated = [Instance("generate_until", {}, (f"{ctx} {w}", {"until": ["."], "max_gen_toks": 6}), i)
                 for i, w in enumerate(("girl", "dog"))]
    rolled = [Instance("loglikelihood_rolling", {}, ("Once upon a time.",), 0)]
    results = lm.loglikelihood(scored), lm.generate_until(generated), lm.loglikelihood_rolling(rolled)
    for attr, requests, got in zip(("loglikelihood", "generate_until"), (scored, generated), results):
        assert [caching.dbdict[hash_args(attr, r.args)] for r in requests] == [tuple(g) if attr == "loglikelihood"
                                                                               else g for g in got]
    assert hash_args("loglikelihood_rolling", rolled[0].args) not in caching.dbdict  # its sum, CachingLM's to write
    # the rerun through the cache: the answers kept, and only a new request goes to the model
    before = lm.pool.stats()["answered"]
    again = caching.loglikelihood(scored + [Instance("loglikelihood", {}, ("The moon", " was cold"), 4)])
    assert [tuple(r) for r in again[:4]] == [tuple(r) for r in results[0]]
    assert lm.pool.stats()["answered"] == before + 1
    caching.dbdict.close()
