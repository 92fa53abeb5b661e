import re
from pathlib import Path

import pytest

from ggbatch.runner.config.job_file import load_job_file
from ggbatch.runner.config.schema import build_config
from ggbatch.runner.errors import ConfigError
from helpers import ggbatch


def job(tmp_path, text, name="job.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_flags_override_job_file_which_overrides_defaults(tmp_path):
    path = job(tmp_path, "model: m.gguf\ninput: q.jsonl\noutput: a.json\nworkers: 2\n"
                         "sampling:\n  temperature: 0.7\n  seed: 3\n")
    config = build_config([(path, load_job_file(path)), ("command line", {"workers": "1", "max_tokens": "32"})])
    assert config.workers == 1
    assert config.max_tokens == 32
    assert config.sampling.temperature == 0.7 and config.sampling.seed == 3
    assert config.slots is None  # default auto
    assert config.n_batch is None  # default auto: runner/plan/layout.py batch_budget


def test_job_paths_are_relative_to_the_job_file(tmp_path):
    (tmp_path / "jobs").mkdir()
    path = job(tmp_path / "jobs", "model: demo\ninput: q.jsonl\noutput: ../a.json\n")
    flat = load_job_file(path)
    assert flat["model"] == "demo"
    assert flat["input"] == str(tmp_path / "jobs" / "q.jsonl")
    assert Path(flat["output"]).resolve() == (tmp_path / "a.json").resolve()


def test_model_mapping_with_context(tmp_path):
    path = job(tmp_path, "model:\n  path: /m.gguf\n  n_ctx: 1024\ninput: /q\noutput: /a.json\n")
    config = build_config([(path, load_job_file(path))])
    assert (config.model, config.n_ctx) == ("/m.gguf", 1024)


@pytest.mark.parametrize("value,expected", [(True, True), (False, False), ("auto", None), ("false", False),
                                            ("True", True)])
def test_repack_is_true_false_or_auto(value, expected):
    config = build_config([("flags", {"model": "m", "input": "i", "output": "o", "model.repack": value})])
    assert config.repack is expected


@pytest.mark.parametrize("text,expected", [("", "auto"), ("threads_adapt: off\n", "off"),
                                           ("threads_adapt: auto\n", "auto"), ("threads_adapt: false\n", "off")])
def test_threads_adapt_is_auto_or_off_and_yamls_bare_off_means_off(tmp_path, text, expected):
    path = job(tmp_path, "model: m\ninput: i\noutput: o\n" + text)
    assert build_config([(path, load_job_file(path))]).threads_adapt == expected
    flags = build_config([(path, load_job_file(path)), ("command line", {"threads_adapt": "off"})])
    assert flags.threads_adapt == "off"


def test_auto_values(tmp_path):
    config = build_config([("flags", {"model": "m", "input": "i", "output": "o", "workers": "auto",
                                      "slots": "auto", "model.n_ctx": "auto"})])
    assert (config.workers, config.slots, config.n_ctx) == (None, None, None)


@pytest.mark.parametrize("text,message", [
    ("sampling:\n  temprature: 1\n", "unknown key 'temprature' in sampling (did you mean 'temperature'?)"),
    ("wokers: 2\n", "unknown key 'wokers' (did you mean 'workers'?)"),
    ("n: 2\n", "unknown key 'n' (did you mean 'sampling.n'? write it under sampling:)"),
    ("sampling:\n  max_tokens: 3\n", "unknown key 'max_tokens' in sampling (did you mean 'max_tokens'? write it "
                                     "at the top level)"),
    # written with its dot: the hint in that spelling too
    ("sampling.tmperature: 0\n", "unknown key 'sampling.tmperature' (did you mean 'sampling.temperature'?)"),
    ("model.n_ctxx: 512\n", "unknown key 'model.n_ctxx' (did you mean 'model.n_ctx'?)"),
    ("samplng.temperature: 0\n", "unknown key 'samplng.temperature' (did you mean 'sampling.temperature'?)"),
    ("sampling.n_ctx: 512\n", "unknown key 'sampling.n_ctx' (did you mean 'model.n_ctx'?)"),
    ("sampling.workers: 2\n", "unknown key 'sampling.workers' (did you mean 'workers'?)"),
    ("sampling.temperature: -1\n", "sampling.temperature: must be >= 0.0, got -1"),
    ("sampling:\n  temperature: -1\n", "sampling.temperature: must be >= 0.0, got -1"),
    ("workers: two\n", "workers: must be an integer or auto, got 'two'"),
    ("workers: 0\n", "workers: must be >= 1, got 0"),
    ("threads_adapt: sometimes\n", "threads_adapt: must be auto or off, got 'sometimes'"),
    ("slots: 300\n", "slots: must be <= 255 (a llama.cpp context holds at most 256 sequences, one of them "
                     "the shared prefix), got 300"),
    ("ignore_eos: yes please\n", "ignore_eos: must be true or false"),
    ("model_:\n  path: m\n  repack: sometimes\n", "model.repack: must be true, false or auto, got 'sometimes'"),
    ("stop: [1, 2]\n", "stop: must be a list of non-empty strings"),
    ("input_format: xml\n", "input_format: must be auto, json, jsonl, csv or openai, got 'xml'"),
    ("output_format: tsv\n", "output_format: must be auto, json, jsonl, csv or openai, got 'tsv'"),
    ("prompt:\n  template_kwargs: [1]\n", "prompt.template_kwargs: must be a mapping of names to values"),
    ("sampling:\n  top_p: 0\n", "sampling.top_p: must be > 0.0 and <= 1.0"),
    # a section given a plain value: its keys, and the one the value most likely meant, as YAML
    ("sampling: 0.5\n", "sampling: must be a mapping of its keys (temperature, top_k, top_p, min_p, repeat_penalty, "
                        "repeat_last_n, presence_penalty, frequency_penalty, seed, n), got 0.5"),
    ("answer: A,B\n", "answer: must be a mapping of its keys (choices, logprobs, choice_logits, choice_scoring, "
                      "token_logprobs, json_schema, grammar), got 'A,B' (did you mean answer: {choices: 'A,B'}?)"),
    ("prompt: '{{ question }}'\n", "prompt: must be a mapping of its keys (template, chat_template, template_kwargs), "
                                   "got '{{ question }}' (did you mean prompt: {template: '{{ question }}'}?)"),
    ("fields: x\n", "fields: must be a mapping of its keys (id, question), got 'x'"),
    ("reasoning: 5\n", "reasoning: must be a mapping of its keys (max_tokens), got 5 (did you mean reasoning: "
                       "{max_tokens: 5}?)"),
    ("- a\n- b\n", "a job file must be a mapping"),
    ("workers: [\n", "job.yaml:5: expected the node content"),
    ("system: \"a\x01\"\n", "job.yaml:4:11: character #x0001 ('\\x01'): special characters are not allowed"),
    ("ignore_eos: 'false'\n", "ignore_eos: must be true or false (a quoted string here: write it without quotes), "
                              "got 'false'"),
    ("sampling:\n  seed: '1180591620717411303424'\n", "sampling.seed: must be <= 18446744073709551615, got"),
    ("sampling.seed: 3\nsampling:\n  seed: 4\n", "key 'sampling.seed' given twice, once written with its dot and "
                                                 "once in its section"),
    ("sampling:\n  seed: 4\nsampling.seed: 3\n", "key 'sampling.seed' given twice"),
    ("model.path: b.gguf\n", "'model' and 'model.path' both set the same setting: give one of them"),
    ("model_:\n  path: b.gguf\nmodel.path: c.gguf\n", "key 'model.path' given twice"),
    # past Python's int-string limit: PyYAML's int() raised a ValueError, a traceback and exit 1
    ("workers: 2\nmax_tokens: " + "9" * 5000 + "\n", "job.yaml:5: an integer of more than 4300 digits is too long"),
])
def test_errors_name_file_and_key(tmp_path, text, message):
    # model_: the model section, which replaces the file's `model: m` (a key given twice is an error)
    head = "input: i\noutput: o\n" if text.startswith("model_:") else "model: m\ninput: i\noutput: o\n"
    text = text.replace("model_:", "model:", 1)
    path = job(tmp_path, head + text if not text.startswith("-") else text)
    with pytest.raises(ConfigError) as err:
        build_config([(path, load_job_file(path))])
    assert message in str(err.value)
    assert str(err.value).startswith(path)


@pytest.mark.model
@pytest.mark.timeout(120)
def test_flash_attention_asked_for_under_batch_invariant_is_refused_naming_it(tmp_path, demo_model):
    """It ran off without a word, where model.repack: true is refused."""
    path = job(tmp_path, "model: m\ninput: i\noutput: o\nbatch_invariant: true\nflash_attn: true\n")
    with pytest.raises(ConfigError, match="flash_attn: true cannot be combined with batch_invariant") as err:
        build_config([(path, load_job_file(path))])
    assert str(err.value).startswith(path)
    for flash in ("false", "auto"):  # what batch-invariant mode runs anyway
        flags = {"flash_attn": flash, "batch_invariant": True}
        assert build_config([(path, load_job_file(path)), ("command line", flags)]).batch_invariant
    (tmp_path / "q.jsonl").write_text('{"questionID": "a", "question": "Hi?"}\n')
    done = ggbatch("run", "--model", demo_model, "--input", tmp_path / "q.jsonl", "--output", tmp_path / "a.jsonl",
                   "--batch-invariant", "--flash-attn", "true", "-q", timeout=100)
    assert done.returncode == 2 and done.stderr.startswith("ggbatch: error: flash_attn: true cannot be combined "
                                                           "with batch_invariant"), done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "a.jsonl").exists()


def test_a_section_with_every_key_commented_out_sets_nothing(tmp_path):
    path = job(tmp_path, "model: m\ninput: i\noutput: o\nsampling:\n#  temperature: 0.7\n")
    assert build_config([(path, load_job_file(path))]).sampling == build_config(
        [("flags", {"model": "m", "input": "i", "output": "o"})]).sampling


def test_missing_required_setting():
    with pytest.raises(ConfigError, match="missing required setting 'model'"):
        build_config([("command line", {"input": "i", "output": "o"})])


def test_an_empty_job_file_is_named(tmp_path):
    path = job(tmp_path, "# nothing yet\n")
    with pytest.raises(ConfigError, match=f"^missing required setting 'model' \\(give it in the job file {path}, "
                                          "which is empty, or as --model\\)$"):
        build_config([(path, load_job_file(path)), ("command line", {"input": "i", "output": "o"})])


@pytest.mark.parametrize("name, content, message", [
    ("q.jsonl", b'{"questionID": "a", "question": "Hi?"}\n', "looks like a question file (JSON Lines), not a job "
                                                              "file (YAML): give it as --input"),
    ("q.csv", b"questionID,question\na,Hi?\n", "looks like a question file (CSV)"),
    ("q.json", b'[{"questionID": "a", "question": "Hi?"}]\n', "looks like a question file (a JSON array)"),
    ("m.gguf", b"GGUF\x03\x00\x00\x00\x80\x00", "a GGUF model, not a job file (YAML): give it as --model"),
    ("model", b"GGUF\x03\x00\x00\x00\x80\x00", "a GGUF model"),
])
def test_a_question_file_or_model_given_as_the_job_file_is_named_for_what_it_is(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: {re.escape(message)}"):
        load_job_file(str(path))
    if name == "q.json":  # a JSON mapping is YAML, and a job file
        path.write_text('{"model": "m", "input": "i", "output": "o"}\n')
        assert load_job_file(str(path))["input"] == str(tmp_path / "i")


def test_a_job_file_in_latin_1_names_the_line_and_column_of_the_byte(tmp_path):
    """It said "cannot read job file: 'utf-8' codec can't decode byte 0xe9 in position 63"."""
    path = tmp_path / "job.yaml"
    path.write_bytes("model: demo\nprompt:\n  system: \"caf\xe9\"\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}:3: not UTF-8 text \\(byte 0xe9 at column 15\\); "
                                          "save the file as UTF-8$"):
        load_job_file(str(path))


def test_a_job_file_in_utf_16_is_read_with_its_mark_and_named_without_it(tmp_path):
    """Without a mark it was YAML's "character #x0000 ('\\x00'): special characters are not allowed"."""
    text = "model: demo\ninput: q.jsonl\noutput: a.json\nsystem: \"café\"\n"
    path = tmp_path / "job.yaml"
    path.write_bytes(text.encode("utf-16-le"))
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}:1: UTF-16 text without a byte order mark "
                                          "\\(every other byte is zero\\); save the file as UTF-8"):
        load_job_file(str(path))
    path.write_bytes(text.encode("utf-16"))  # with its mark, as a question file may be
    assert load_job_file(str(path))["system"] == "café"


def test_a_lone_surrogate_in_a_value_is_refused_naming_the_file_and_the_key(tmp_path):
    """It passed, and every question failed at tokenization with an error naming neither."""
    path = job(tmp_path, 'model: m\ninput: q.jsonl\noutput: a.json\nsystem: "a\\ud800b"\n')
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}: system: U\\+D800 at character 2 is half of a "
                                          "surrogate pair: must be text UTF-8 can write, got 'a\\\\ud800b'$"):
        build_config([(path, load_job_file(path))])
    nested = job(tmp_path, 'model: m\ninput: q.jsonl\noutput: a.json\nstop: ["x", "\\udfff"]\n', "nested.yaml")
    with pytest.raises(ConfigError, match="nested.yaml: stop: U\\+DFFF at character 1"):
        build_config([(nested, load_job_file(nested))])
    # a flag's byte that is not UTF-8 arrives as one (surrogateescape), and is named as that byte
    flags = {"model": "m", "input": "q.jsonl", "output": "a.json", "system": "caf\udce9"}
    with pytest.raises(ConfigError, match=r"^command line: system: U\+DCE9 at character 4 is half of a surrogate "
                                          r"pair \(in a command-line argument, the byte 0xe9, which is not UTF-8\)"):
        build_config([("command line", flags)])
    # a file's name may hold such bytes
    assert build_config([("command line", {**flags, "system": "s", "input": "caf\udce9.jsonl"})]).input == \
        "caf\udce9.jsonl"
    grammar_file = tmp_path / "g\udce9.gbnf"
    grammar_file.write_text('root ::= "a"')
    assert build_config([("command line", {**flags, "system": "s", "answer.grammar": str(grammar_file)})]).grammar
    # a grammar or schema written inline is text llama.cpp reads (the grammar was a traceback)
    for key, inline in (("answer.grammar", 'root ::= "a\ud800"'), ("answer.json_schema", '{"enum": ["\ud800"]}'),
                        ("answer.json_schema", {"enum": ["a\ud800"]})):
        with pytest.raises(ConfigError, match=f"^command line: {key}: U\\+D800 at character"):
            build_config([("command line", {**flags, "system": "s", key: inline})])


def test_a_lone_surrogate_written_as_an_escape_in_a_schema_or_grammar_is_refused(tmp_path, monkeypatch):
    """JSON's "\\ud800" and GBNF's \\uD800 are ASCII text: they passed, and the grammar made every
    answer three U+FFFD under a schema it claimed they met."""
    monkeypatch.chdir(tmp_path)
    flags = {"model": "m", "input": "q.jsonl", "output": "a.json"}
    schema_file = Path("s.json")
    schema_file.write_text('{"type": "object", "properties": {"\\ud800": {"type": "integer"}}}')
    grammar_file = Path("g.gbnf")
    grammar_file.write_text('root ::= "a" [\\U0000DFFF] # a comment may say \\uD800\n')
    for key, value, message in (
            ("answer.json_schema", '{"enum": ["\\ud800"]}', "U\\+D800 at character 1 is half of a surrogate pair"),
            ("answer.json_schema", str(schema_file), "U\\+D800 at character 1 is half of a surrogate pair"),
            ("answer.grammar", 'root ::= "\\ud800"', "the escape .ud800 at character 11 names U\\+D800, which is half"),
            ("answer.grammar", str(grammar_file), "the escape \\\\U0000DFFF at character 15 names U\\+DFFF"),
            ("answer.grammar", 'root ::= "\\U00110000"', "the escape .U00110000 at character 11 names U\\+110000, "
                                                        "which is past")):
        with pytest.raises(ConfigError, match=f"^command line: {key}: {message}.*, got {re.escape(repr(value))}$"):
            build_config([("command line", {**flags, key: value})])
    # as a quoted string in a job file, and the file named
    path = job(tmp_path, 'model: m\ninput: q.jsonl\noutput: a.json\nanswer:\n'
                         '  json_schema: \'{"enum": ["\\ud800"]}\'\n')
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}: answer.json_schema: U\\+D800"):
        build_config([(path, load_job_file(path))])
    # an escaped backslash before u is no escape, nor is an escape in a comment
    assert build_config([("command line", {**flags, "answer.grammar": 'root ::= "\\\\ud800" # \\ud800'})]).grammar


def test_missing_job_file(tmp_path):
    with pytest.raises(ConfigError, match="job file not found"):
        load_job_file(str(tmp_path / "nope.yaml"))


def test_example_job_is_valid():
    root = Path(__file__).resolve().parents[1]
    path = str(root / "jobs" / "example.yaml")
    config = build_config([(path, load_job_file(path))])
    assert config.model == "demo"
    assert Path(config.input).exists()


def test_template_kwargs_and_keep_thinking(tmp_path):
    path = job(tmp_path, "model: m\ninput: i\noutput: o\nkeep_thinking: true\n"
                         "prompt:\n  template_kwargs:\n    enable_thinking: false\n")
    config = build_config([(path, load_job_file(path))])
    assert config.template_kwargs == {"enable_thinking": False} and config.keep_thinking


@pytest.mark.parametrize("key,value", [("sampling.temperature", "nan"), ("sampling.temperature", "inf"),
                                       ("sampling.top_p", "nan"), ("sampling.min_p", float("nan")),
                                       ("sampling.repeat_penalty", "-inf"), ("sampling.temperature", "1e400")])
def test_non_finite_numbers_are_refused(key, value):
    # nan passes every `<` bound check, gives gibberish, and (nan != nan) could never be resumed
    with pytest.raises(ConfigError, match=f"{key}: must be a finite number"):
        build_config([("command line", {"model": "m", "input": "i", "output": "o", key: value})])


HUGE = {"int": 10**5000, "digits": "9" * 100_000, "text": "x" * 10_000, "list": [["a"] * 5000]}


@pytest.mark.parametrize("key,kind", [("max_tokens", "digits"), ("max_tokens", "int"),
                                      ("sampling.temperature", "text"), ("stop", "list"), ("system", "list")])
def test_an_error_quoting_a_huge_value_stays_one_short_line(key, kind):
    value = HUGE[kind]
    with pytest.raises(ConfigError) as err:
        build_config([("command line", {"model": "m", "input": "i", "output": "o", key: value})])
    message = str(err.value)
    assert message.startswith(f"command line: {key}: ") and "\n" not in message and len(message) < 200


def test_counts_beyond_32_bits_are_refused():
    with pytest.raises(ConfigError, match="max_tokens: must be <= 2147483647"):
        build_config([("command line", {"model": "m", "input": "i", "output": "o", "max_tokens": 2**40})])


def test_file_formats_and_the_errors_file(tmp_path):
    path = job(tmp_path, "model: m\ninput: q.csv\noutput: a.jsonl\ninput_format: csv\noutput_format: openai\n"
                         "errors_output: failed.jsonl\n")
    config = build_config([(path, load_job_file(path))])
    assert (config.input_format, config.output_format) == ("csv", "openai")
    assert config.errors_output == str(tmp_path / "failed.jsonl")  # beside the job file, like every path
    auto = build_config([("flags", {"model": "m", "input": "i", "output": "o", "input_format": "auto"})])
    assert (auto.input_format, auto.output_format, auto.errors_output) == (None, None, None)


@pytest.mark.parametrize("text,flags,message", [
    ("ray_address: auto\n", {}, "ray_address: auto is for backend: ray (--backend ray), the backend is local"),
    ("backend: ray\nray_address: auto\n", {"backend": "local"}, "ray_address: auto is for backend: ray"),
    ("sampling: {n: 3}\n", {}, "sampling.n: 3 samples need sampling.temperature > 0"),
    ("answer: {choices: [A, B], grammar: 'root ::= \"x\"'}\n", {}, "answer.choices and answer.grammar: give one"),
    ("answer: {logprobs: true}\n", {}, "answer.logprobs: needs answer.choices"),
])
def test_errors_between_keys_name_the_job_file_that_set_them(tmp_path, text, flags, message):
    """They named the key alone (`ray_address: auto is for ...`) where a key's own error says `j.yaml: key: ...`."""
    path = job(tmp_path, "model: m\ninput: i\noutput: o\n" + text)
    with pytest.raises(ConfigError) as err:
        build_config([(path, load_job_file(path)), ("command line", flags)])
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


def test_an_error_between_keys_begun_by_a_flags_key_names_the_files_key_after_it(tmp_path):
    """`j.yaml: sampling.n: 3 samples ...` sent the user looking for sampling.n in a file only
    the flag --n set; the file's key is named where it is."""
    path = job(tmp_path, "model: m\ninput: i\noutput: o\nanswer: {choice_scoring: loglikelihood, choices: [a, b]}\n")
    with pytest.raises(ConfigError) as err:
        build_config([(path, load_job_file(path)), ("command line", {"sampling.n": 3, "sampling.temperature": 0.5})])
    assert str(err.value) == ("sampling.n: 3 samples with answer.choice_scoring: loglikelihood would be the same "
                              f"scores: log-likelihoods are not sampled (answer.choice_scoring from {path})")


def test_an_error_between_keys_the_command_line_set_names_no_job_file(tmp_path):
    """The file's ray_address is replaced by the flag's; the backend is the default's."""
    path = job(tmp_path, "model: m\ninput: i\noutput: o\nray_address: auto\n")
    with pytest.raises(ConfigError, match=r"^ray_address: 10.0.0.1:6379 is for backend: ray"):
        build_config([(path, load_job_file(path)), ("command line", {"ray_address": "10.0.0.1:6379"})])


def test_a_tab_in_a_job_file_says_yaml_indents_with_spaces(tmp_path):
    """An editor's tab was 'found character '\\t' that cannot start any token', which did not say why."""
    path = tmp_path / "job.yaml"
    path.write_text("model: m.gguf\nsampling:\n\ttemperature: 0.5\n")
    with pytest.raises(ConfigError) as err:
        load_job_file(str(path))
    assert str(err.value) == (f"{path}:3: found character '\\t' that cannot start any token (YAML indents with "
                              "spaces, not tabs)")
