"""What an answer must be, without a model: the answer.* keys and flags, the choice grammar and
the pick among choices, a record's own choices, the context a choices job needs, and what reaches
the journal's fingerprint."""

import json
import re
from array import array

import pytest

from ggbatch.runner.cli import _flag_layer, build_parser
from ggbatch.runner.config.answer import (
    choice_tokens,
    format_grammar,
    record_choices,
    schema_grammar,
    schema_openers,
    scored_texts,
    with_choices,
)
from ggbatch.runner.config.job_file import load_job_file
from ggbatch.runner.config.schema import CHOICES_AUTO, build_config
from ggbatch.runner.errors import ConfigError, InputError
from ggbatch.runner.files.formats.own_settings import settings_key
from ggbatch.runner.journal.fingerprint import changed_setting
from ggbatch.runner.journal.journal import prompt_hash
from ggbatch.workers.engine.constraints import best_choice, choice_grammar, choice_logprobs, choice_text, gbnf_literal
from ggbatch.workers.protocol import AnswerSpec, GenerationParams, ResponseFormat

BASE = {"model": "m.gguf", "input": "q.jsonl", "output": "a.jsonl"}


def config(**answer):
    return build_config([("test", {**BASE, **{f"answer.{k}": v for k, v in answer.items()}})])


def test_choices_from_a_list_a_comma_string_or_auto():
    assert config(choices=["A", "B", "C"]).choices == ("A", "B", "C")
    assert config(choices="A, B,C,D").choices == ("A", "B", "C", "D")
    assert config(choices="auto").choices == CHOICES_AUTO
    assert config(choices=["yes", "no"], logprobs=True).choice_logprobs


@pytest.mark.parametrize("value, said", [
    (["A"], "two or more"), ("A,A", "each choice once"), (["A", ""], "two or more"), (3, "two or more")])
def test_bad_choices_name_the_key(value, said):
    with pytest.raises(ConfigError, match=f"test: answer.choices: .*{said}"):
        config(choices=value)


def test_json_schema_inline_as_a_mapping_or_a_file(tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    assert config(json_schema=schema).json_schema == canonical
    assert config(json_schema=json.dumps(schema)).json_schema == canonical
    f = tmp_path / "s.json"
    f.write_text(json.dumps(schema))
    assert config(json_schema=str(f)).json_schema == canonical
    job = tmp_path / "job.yaml"
    job.write_text("model: m.gguf\ninput: q.jsonl\noutput: a.jsonl\nanswer:\n  json_schema: s.json\n")
    assert build_config([("job", load_job_file(str(job)))]).json_schema == canonical  # beside the job file
    job.write_text("model: m.gguf\ninput: q.jsonl\noutput: a.jsonl\nanswer:\n  json_schema: {type: object}\n")
    assert build_config([("job", load_job_file(str(job)))]).json_schema == '{"type":"object"}'


@pytest.mark.parametrize("value, said", [
    ("missing.json", "no such file"), ("{not json", "not valid JSON"), ([1], "must be a JSON Schema object")])
def test_bad_json_schema_names_the_key(value, said):
    with pytest.raises(ConfigError, match=f"answer.json_schema: {said}"):
        config(json_schema=value)


def test_one_kind_of_answer_at_a_time_and_logprobs_need_choices():
    with pytest.raises(ConfigError, match="answer.choices and answer.grammar: give one"):
        config(choices="A,B", grammar='root ::= "x"')
    with pytest.raises(ConfigError, match="answer.logprobs: needs answer.choices"):
        config(logprobs=True)
    with pytest.raises(ConfigError, match="answer.grammar: must be GBNF"):
        config(grammar=" ")


def test_flags_reach_the_answer_keys(tmp_path):
    args = build_parser().parse_args(["run", "--model", "m.gguf", "--input", "q.jsonl", "--output", "a.jsonl",
                                      "--choices", "A,B,C,D", "--choice-logprobs"])
    cfg = build_config([("command line", _flag_layer(args))])
    assert (cfg.choices, cfg.choice_logprobs) == (("A", "B", "C", "D"), True)
    args = build_parser().parse_args(["run", "--model", "m.gguf", "--input", "q.jsonl", "--output", "a.jsonl",
                                      "--grammar", 'root ::= "a"'])
    assert build_config([("command line", _flag_layer(args))]).grammar == 'root ::= "a"'


def test_choice_grammar_escapes_and_allows_one_leading_space():
    assert gbnf_literal('say "hi"\\\n') == r'"say \"hi\"\\\n"'
    assert choice_grammar(["A", 'B"']) == 'root ::= " "? ("A" | "B\\"")\n'
    assert choice_text(" B", ["A", "B"]) == "B"
    assert choice_text("B", ["A", "B", " B"]) == "B"
    assert choice_text(" B", ["A", " B"]) == " B"
    assert choice_text(" Tr", ["True", "False"]) == " Tr"  # cut by max_tokens: as it is


def test_best_choice_takes_the_highest_and_the_earliest_of_equals():
    assert best_choice([-3.0, -1.0, -2.0]) == 1
    assert best_choice([-1.0, -1.0]) == 0
    assert choice_logprobs(["A", "B"], [-0.1234567891, -2.0]) == {"A": -0.123457, "B": -2.0}


def test_a_records_own_choices():
    assert record_choices({"choices": {"A": "4", "B": "8"}}, "q.jsonl:1", "q1").answered == ("A", "B")
    assert record_choices({"choices": ["yes", "no"]}, "q.jsonl:1", "q1").answered == ("yes", "no")
    with pytest.raises(InputError, match="q.jsonl:3: record 'q3' has no 'choices'"):
        record_choices({"question": "x"}, "q.jsonl:3", "q3")
    # equal texts are answered (scored alike, the first wins); an empty one or equal labels are not
    assert record_choices({"choices": ["12", "-4", "4", "12"]}, "q.jsonl:3", "q3").answered == ("12", "-4", "4", "12")
    with pytest.raises(InputError, match="q.jsonl:3: record 'q3': choices must be non-empty"):
        record_choices({"choices": ["a", ""]}, "q.jsonl:3", "q3")
    with pytest.raises(InputError, match="labels distinct"):
        record_choices({"choices": {"text": ["a", "b"], "label": ["A", "A"]}}, "q.jsonl:3", "q3")


def test_a_choices_answer_needs_no_more_tokens_than_its_longest_choice_has_bytes():
    assert choice_tokens(256, ("A", "B")) == 3  # " A" at most two tokens, then the end of generation
    assert choice_tokens(256, ("True, True", "False")) == 12
    assert choice_tokens(2, ("True, True",)) == 2
    job = GenerationParams(256, answer=AnswerSpec(logprobs=True))
    own = with_choices(job, ("A", "B", "C"))
    assert own.answer == AnswerSpec(("A", "B", "C"), logprobs=True) and own.max_tokens == 3


def test_other_choices_or_another_grammar_change_the_journal_key():
    tokens = array("i", [1, 2, 3])
    a = GenerationParams(3, answer=AnswerSpec(("A", "B")))
    b = GenerationParams(3, answer=AnswerSpec(("A", "B", "C")))
    c = GenerationParams(3, answer=AnswerSpec(grammar='root ::= "x"'))
    assert len({prompt_hash(tokens, g) for g in (a, b, c, None)}) == 4
    assert settings_key(a) != settings_key(b)
    assert changed_setting({"answer": None}, {"answer": {"choices": ["A"]}}) == "answer"


@pytest.mark.model  # llama-cpp-python's converter: imports llama.cpp
def test_an_unconvertible_schema_says_why():
    with pytest.raises(ValueError, match="cannot turn this JSON schema into a grammar"):
        schema_grammar(json.dumps({"type": "object", "properties": {"a": {"$ref": "#/defs/missing"}}}))
    assert "root ::=" in schema_grammar(json.dumps({"type": "object"}))


@pytest.mark.model  # llama-cpp-python's converter: imports llama.cpp
@pytest.mark.parametrize("fmt", ["email", "uri", "ipv4", "int32", 3])
def test_a_format_the_converter_gives_a_plain_strings_grammar_is_refused(fmt):
    """format: email gave the very grammar of {"type": "string"}: answers like '" Anna,"' were written."""
    schema = {"type": "object", "properties": {"who": {"type": "string", "format": fmt, "maxLength": 8}}}
    said = f"the grammar cannot enforce 'format': {fmt!r} (at properties.who), so answers could break the schema"
    with pytest.raises(ValueError, match=f"^{re.escape(said)}"):
        schema_grammar(json.dumps(schema))
    response_format = ResponseFormat("json_schema", json.dumps(schema, sort_keys=True))  # an OpenAI line's
    with pytest.raises(ValueError, match=f"^body.response_format: json_schema.schema: {re.escape(said)}"):
        format_grammar(response_format)


@pytest.mark.model
def test_the_formats_the_converter_has_rules_for_are_taken_and_a_format_beside_a_pattern_is_not():
    plain = schema_grammar(json.dumps({"type": "string"}))
    for fmt in ("date", "time", "date-time", "uuid", "uuid4"):
        assert schema_grammar(json.dumps({"type": "string", "format": fmt})) != plain
    with pytest.raises(ValueError, match="cannot enforce 'format': 'date' beside 'pattern'"):
        schema_grammar(json.dumps({"type": "string", "format": "date", "pattern": "^[0-9]+$"}))


@pytest.mark.model
@pytest.mark.parametrize("schema, said", [
    ({"type": "string", "format": "date", "maxLength": 4}, "'maxLength' beside 'format'"),  # 10 characters came out
    ({"type": "integer", "minLength": 3},
     "'minLength' beside 'type': 'integer' (it is read only with 'type': 'string')"),
    ({"type": "array", "minItems": 2}, "'minItems' beside 'type': 'array' (it is read only with 'items')"),
    ({"type": "object", "required": ["a"]}, "'required' beside 'type': 'object' (it is read only with 'properties')"),
    ({"const": "x", "format": "date"}, "'format': 'date' beside 'const'"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "allOf": [{"required": ["a"]}]},
     "'allOf' beside 'properties'"),
    ({"type": "object", "anyOf": [{"type": "string"}]}, "'type' beside 'anyOf'"),
])
def test_a_keyword_the_converter_drops_beside_anothers_rule_is_refused(schema, said):
    """The converter makes one rule per schema object and drops its other keywords: a date under
    "maxLength": 4 was written 10 characters long."""
    with pytest.raises(ValueError, match=f"^the grammar cannot enforce {re.escape(said)}, so answers could break"):
        schema_grammar(json.dumps(schema))


@pytest.mark.model
@pytest.mark.parametrize("schema", [
    {"type": "string", "enum": ["a", "b"], "title": "Pick"},  # pydantic's enum
    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    {"type": "string", "minLength": 1, "maxLength": 3},
    {"$defs": {"a": {"type": "string"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
     "required": ["x"], "additionalProperties": False},
    {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},  # pydantic's Optional[int]
])
def test_the_keywords_each_rule_reads_are_taken_together(schema):
    assert "root ::=" in schema_grammar(json.dumps(schema))


ARC = {"choices": {"text": ["girl", "dog house"], "label": ["A", "B"]}}


@pytest.mark.parametrize("prompt, texts", [
    ("Once upon a time there was a little", ("girl", "dog house")),  # ARC: not listed, the texts are scored
    ("a little\n\nA. girl\nB. dog house", ()),  # MMLU's listing: the labels are
    ("a little\n(A) girl (B) dog house", ()),
    ("a little\nA: girl\nB: dog house", ()),
    ("a little\nA - girl\nB - dog house", ()),  # was read as not listed: the texts scored behind letters shown
    ("a little girl in a dog house", ("girl", "dog house")),  # the texts, but beside no label
    ("a little\nA. girl", ("girl", "dog house")),  # one listed, not both
])
def test_labelled_choices_are_scored_by_their_texts_unless_the_prompt_lists_them_beside_their_labels(prompt, texts):
    assert scored_texts(record_choices(ARC, "q.jsonl:1", "q1"), prompt) == texts
    bare = record_choices({"choices": ["girl", "dog house"]}, "q.jsonl:1", "q1")
    assert scored_texts(bare, prompt) == ()  # a bare list: the texts are the choices


@pytest.mark.parametrize("schema, openers", [
    ({"type": "object"}, ("{",)),
    ({"properties": {"a": {"type": "integer"}}}, ("{",)),
    ({"$ref": "#/$defs/o", "$defs": {"o": {"type": "object"}}}, ("{",)),  # each of these ran every question,
    ({"anyOf": [{"type": "object"}, {"type": "array"}]}, ("[", "{")),     # then failed it: only a root `type`
    ({"type": ["object", "array"]}, ("[", "{")),                          # was read
    ({"allOf": [{"type": "object"}]}, ("{",)),
    ({"enum": ["a", "b"]}, ('"',)),
    ({"type": "integer"}, ()),  # digits and a minus: not checked
    ({"anyOf": [{"type": "object"}, {"type": "integer"}]}, ()),
    ({}, ()),
])
def test_the_characters_a_schemas_answers_may_start_with_are_found_through_its_wrappers(schema, openers):
    assert schema_openers(json.dumps(schema)) == openers


def test_an_arc_column_pandas_wrote_from_a_hugging_face_dataset_is_read(tmp_path):
    """Its lists are numpy arrays there: `{'text': array(['a dog', 'a cat'], dtype=object), ...}`,
    refused as 'no choices mapping or list' though answers.md promises pandas' to_csv spelling."""
    import csv

    np, pd = pytest.importorskip("numpy"), pytest.importorskip("pandas")
    choices = {"text": np.array(["a dog", "a cat, or (a) [lion]"], dtype=object),
               "label": np.array(["A", "B"], dtype=object)}
    pd.DataFrame([{"id": "q1", "choices": choices}]).to_csv(tmp_path / "arc.csv", index=False)
    with open(tmp_path / "arc.csv", newline="") as f:
        cell = next(csv.DictReader(f))["choices"]
    assert "array([" in cell
    read = record_choices({"choices": cell}, "arc.csv:2", "q1")
    assert read.answered == ("A", "B")
    assert scored_texts(read, "Which says meow?") == ("a dog", "a cat, or (a) [lion]")
    uneven = {"choices": {"text": ["a", "b", "c"], "label": ["A", "B"]}}
    with pytest.raises(InputError, match=r"^f.jsonl:1: record 'q1': its 'choices' must hold as many labels as texts"):
        record_choices(uneven, "f.jsonl:1", "q1")
