"""The journal's fingerprint (runner/journal/fingerprint.py): what decides an answer, and a
rerun refused where it changed, in words where the change is ggbatch's own rule or a grammar."""

import pytest

from ggbatch import build_config
from ggbatch.runner.errors import ConfigError
from ggbatch.runner.journal.journal import Journal
from ggbatch.workers.protocol import GenerationParams
from test_journal import FP, answer, question


def test_flash_attn_set_otherwise_than_auto_is_fingerprinted_and_a_change_refused(tmp_path):
    from ggbatch import build_config
    from ggbatch.runner.journal.fingerprint import fingerprint
    from ggbatch.runner.model.identity import ModelIdentity

    model = ModelIdentity("m.gguf", 1, 0, "abc")

    def printed(**settings):
        config = build_config([("test", {"model": "m.gguf", "input": "q.jsonl", "output": "a.jsonl", **settings})])
        return fingerprint(config, model, GenerationParams(), "t")

    scored = {"answer.choices": ["A", "B"], "answer.choice_scoring": "loglikelihood"}
    assert "flash_attn" not in printed() and "flash_attn" not in printed(**scored)  # auto: as older journals
    assert "flash_attn" not in printed(flash_attn=False, **scored)  # what auto is for scoring
    assert printed(flash_attn=True, **scored)["flash_attn"] is True and printed(flash_attn=False)["flash_attn"] is False
    path = str(tmp_path / "j.jsonl")
    j = Journal(path, printed(flash_attn=True, **scored))
    j.split([question("q1", 1)])
    j.append([answer("q1")])
    j.close()
    j = Journal(path, printed(**scored))  # on auto: as the journaled run ran, named or not
    assert j.ran("flash_attn") is True
    j.close()


def test_a_journal_that_scored_choices_inside_the_open_thinking_block_is_refused(tmp_path):
    """Before choices were scored after an empty thinking block, a thinking model's were scored as
    the thinking's first words: those journals hold other scores (and their records are reused
    without their prompts made again), so they are refused, with the reason."""
    from ggbatch import build_config
    from ggbatch.runner.journal.fingerprint import fingerprint
    from ggbatch.runner.model.identity import ModelIdentity
    from ggbatch.workers.protocol import Thinking

    config = build_config([("test", {"model": "m.gguf", "input": "q.jsonl", "output": "a.jsonl",
                                     "answer.choices": ["A", "B"], "answer.choice_scoring": "loglikelihood"})])
    thinks = GenerationParams(thinking=Thinking(start=(1,), end=(2,), forced=(2,)))
    now = fingerprint(config, ModelIdentity("m.gguf", 1, 0, "abc"), thinks, "t")
    assert now["answer.choice_scoring_context"] == "after an empty thinking block"
    assert "answer.choice_scoring_context" not in fingerprint(config, ModelIdentity("m.gguf", 1, 0, "abc"),
                                                              GenerationParams(), "t")  # no thinking: as before
    path = str(tmp_path / "j.jsonl")
    j = Journal(path, {k: v for k, v in now.items() if k != "answer.choice_scoring_context"})  # an older version's
    j.split([question("q1", 1)])
    j.append([answer("q1")])
    j.close()
    with pytest.raises(ConfigError, match=r"j.jsonl: the ggbatch version that wrote it scored a thinking model's "
                                          "choices inside the open thinking block; this version scores them after "
                                          "an empty thinking block: its answers are not this one's; pass fresh=True"):
        Journal(path, now)


def test_a_journal_that_scored_labelled_choices_by_their_labels_is_refused_in_words(tmp_path):
    """A record's labelled choices its prompt does not list are scored by their texts now (ARC):
    a resume took the journaled label-scored answers and scored the rest by text, one file mixing
    both, exit 0. (An older version resuming this one's journal finds the key it lacks: refused.)"""
    from ggbatch import build_config
    from ggbatch.runner.journal.fingerprint import fingerprint
    from ggbatch.runner.model.identity import ModelIdentity

    def printed(**settings):
        config = build_config([("test", {"model": "m.gguf", "input": "q.jsonl", "output": "a.jsonl", **settings})])
        return fingerprint(config, ModelIdentity("m.gguf", 1, 0, "abc"), GenerationParams(), "t")

    now = printed(**{"answer.choices": "auto", "answer.choice_scoring": "loglikelihood"})
    assert "answer.labelled_choices" not in printed(**{"answer.choices": "auto"})  # generated among the labels
    assert "answer.labelled_choices" not in printed(**{"answer.choices": ["A", "B"],
                                                      "answer.choice_scoring": "loglikelihood"})  # the job's own
    path = str(tmp_path / "j.jsonl")
    j = Journal(path, {k: v for k, v in now.items() if k != "answer.labelled_choices"})  # an older version's
    j.split([question("q1", 1)])
    j.append([answer("q1")])
    j.close()
    with pytest.raises(ConfigError) as refused:
        Journal(path, now)
    assert str(refused.value) == (f"{path}: the ggbatch version that wrote it scored a record's labelled choices by "
                                  "their labels; this version scores them by their texts, unless the prompt lists "
                                  "them beside their labels: its answers are not this one's; pass fresh=True to "
                                  "start over")


def test_a_changed_schema_is_said_as_the_answers_grammar_not_as_pages_of_gbnf(tmp_path):
    """`'answer.grammar' changed since the journaled run ('integral-part ::= [0-9] | ...' -> ...)`
    named a key the user never set and quoted the schema's converted grammar."""
    path = str(tmp_path / "j.jsonl")
    j = Journal(path, {**FP, "answer": {"choices": [], "grammar": "root ::= [0-9]+"}})
    j.split([question("q1", 1)])
    j.append([answer("q1")])
    j.close()
    with pytest.raises(ConfigError) as refused:
        Journal(path, {**FP, "answer": {"choices": [], "grammar": 'root ::= ("true" | "false")'}})
    assert str(refused.value) == (f"{path}: the answer's grammar (answer.json_schema, or answer.grammar) changed "
                                  "since the journaled run; pass fresh=True to start over")


def test_penalties_are_fingerprinted_when_set_and_journals_from_before_them_stay_valid(tmp_path):
    """sampling.presence_penalty and frequency_penalty at 0 are left out, as journals written
    before they existed have no such keys; set, a change is refused naming the setting."""
    from ggbatch.runner.journal.fingerprint import fingerprint
    from ggbatch.runner.model.identity import ModelIdentity
    from ggbatch.workers.protocol import SamplingParams

    def printed(**sampling):
        return fingerprint(build_config([("test", {"model": "m.gguf", "input": "q", "output": "a"})]),
                           ModelIdentity("m.gguf", 1, 0, "abc"), GenerationParams(sampling=SamplingParams(**sampling)),
                           "t")

    assert not [key for key in printed() if "penalty" in key and key != "sampling.repeat_penalty"]
    assert printed(presence_penalty=0.5)["sampling.presence_penalty"] == 0.5
    path = str(tmp_path / "j.jsonl")
    j = Journal(path, printed())
    j.split([question("q1", 1)])
    j.append([answer("q1")])
    j.close()
    with pytest.raises(ConfigError, match=r"'sampling.frequency_penalty' changed since the journaled run \(0.0 -> 1"):
        Journal(path, printed(frequency_penalty=1.0))
