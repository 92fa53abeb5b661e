"""Answers of a required shape end to end, on real models: fixed choices (MMLU and LSAT-RC
samples, from the logits and under a grammar), JSON schemas and GBNF grammars per job and per
OpenAI Batch line (every answer parsed and validated with jsonschema), errors before any worker
starts, and the journal refusing answers made under other choices."""

import json
import re

import jsonschema
import pytest

from conftest import DATA, MODELS, ROOT, require
from ggbatch import GgbatchError, build_config
from ggbatch import answer as ggbatch_answer
from helpers import ggbatch as cli
from test_openai_batch import parse_output

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]

MMLU, LSAT = DATA / "mmlu" / "questions.jsonl", DATA / "lsat-rc" / "questions.jsonl"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}, "mood": {"enum": ["happy", "sad"]},
                                           "code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
          "required": ["name", "age", "mood"], "additionalProperties": False}


def ggbatch(*args, timeout=240):
    """A run on one thread: beside other busy processes on a small machine, llama.cpp's threads
    wait at every graph node for a descheduled one (docs/guide/layout.md)."""
    threads = ["--threads", "1"] if args[0] == "run" and "--threads" not in args else []
    return cli(*args, *threads, timeout=timeout)


def sample(path, n, tmp_path):
    source = require(path, "a real data set's questions with their lettered choices")
    lines = source.read_text(encoding="utf-8").splitlines()[:n]
    out = tmp_path / path.parent.name
    out.mkdir(exist_ok=True)
    (out / "q.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "q.jsonl", [json.loads(line) for line in lines]


def answers(path):
    return {r["questionID"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_mmlu_with_fixed_choices_gives_only_those_with_their_logprobs(tmp_path, stories):
    q, records = sample(MMLU, 30, tmp_path)
    out = tmp_path / "a.jsonl"
    for slots, path in ((8, out), (1, tmp_path / "one.jsonl")):
        r = ggbatch("run", "--model", stories, "--input", q, "--output", path, "--choices", "A,B,C,D",
                    "--choice-logprobs", "--batch-invariant", "--slots", slots)
        assert r.returncode == 0, r.stderr
    assert out.read_bytes() == (tmp_path / "one.jsonl").read_bytes()  # logits read per row: batch-invariant
    got = answers(out)
    assert len(got) == 30 and {a["answer"] for a in got.values()} <= {"A", "B", "C", "D"}
    for a in got.values():
        lp = a["choice_logprobs"]
        assert list(lp) == ["A", "B", "C", "D"] and all(v < 0 for v in lp.values())
        assert sum(2.718281828 ** v for v in lp.values()) <= 1.0
        assert a["answer"] == max(lp, key=lp.get)
    # the competition pipeline: scored by letter
    r = ggbatch("score", "--answers", out, "--gold", q, "--json", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "s.json").read_text())["overall"]["invalid"] == 0


def test_choice_logprobs_of_choices_of_several_tokens_are_refused_naming_the_choice(tmp_path, stories):
    """yes/no take more than one of stories260K's tokens: the answer is generated under a grammar
    and no choice has a log-probability. The run wrote none and said nothing (exit 0); the pool
    returned choice_logprobs None. Refused before any question, naming the choice and the fix,
    which then writes them; one-token choices still have them."""
    q = tmp_path / "q.jsonl"
    q.write_text('{"questionID": "q1", "question": "Is 7 prime?"}\n')
    run = ("run", "--model", stories, "--input", q, "--choice-logprobs")
    r = ggbatch(*run, "--output", tmp_path / "yn.jsonl", "--choices", "yes,no")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "ggbatch: error: answer.logprobs: the choice 'yes' takes more than one of the model's tokens"), r.stderr
    assert "--choice-scoring loglikelihood" in r.stderr and not (tmp_path / "yn.jsonl").exists()
    r = ggbatch(*run, "--output", tmp_path / "yn.jsonl", "--choices", "yes,no", "--choice-scoring", "loglikelihood")
    assert r.returncode == 0 and list(answers(tmp_path / "yn.jsonl")["q1"]["choice_logprobs"]) == ["yes", "no"]
    r = ggbatch(*run, "--output", tmp_path / "ab.jsonl", "--choices", "A,B")
    assert r.returncode == 0 and list(answers(tmp_path / "ab.jsonl")["q1"]["choice_logprobs"]) == ["A", "B"]
    with pytest.raises(GgbatchError, match="answer.logprobs with answer.choice_logits: false: every answer is "):
        build_config([("job", {"model": stories, "input": str(q), "output": "o.jsonl", "answer.choices": ["A", "B"],
                               "answer.logprobs": True, "answer.choice_logits": False})])
    with pytest.raises(GgbatchError, match="answer.logprobs: the choice 'yes' takes more than one"):
        ggbatch_answer(["Is 7 prime?"], model=stories, max_tokens=8,
                       answer={"choices": ["yes", "no"], "logprobs": True})


def test_lsat_choices_auto_take_each_records_letters_under_a_grammar_too(tmp_path, stories):
    q, records = sample(LSAT, 12, tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {stories}\ninput: {q}\noutput: out.csv\nprompt:\n  template: \"{{{{ question[-600:] }}}}"
                   "\\nAnswer: \"\nanswer:\n  choices: auto\n  choice_logits: false\n")
    r = ggbatch("run", job, "--report", tmp_path / "rep.json")
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "out.csv").read_text().splitlines()
    assert rows[0] == "questionID,answer,error" and len(rows) == 13
    assert all(row.split(",")[1] in ("A", "B", "C", "D", "E") for row in rows[1:])
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["generation"]["own_settings"]["answer.choices"] == 12
    assert rep["generation"]["answer"] == {"choices": "auto", "logprobs": False, "choice_logits": False}
    assert rep["layout"]["n_ctx_per_sequence"] < 600  # sized for a letter, not for max_tokens 256


def test_choices_auto_answers_with_the_labels_of_hugging_faces_shape_and_reads_a_csv_cell(tmp_path, stories):
    # ARC as Hugging Face's to_json writes it (once, every answer was the word "label"), and a CSV
    # whose choices cell holds a JSON list (once refused as having no choices)
    arc = tmp_path / "arc.jsonl"
    arc.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "arc1", "question": "Which is a planet?", "choices": {"text": ["Moon", "Mars", "Sun"],
                                                                     "label": ["A", "B", "C"]}},
        {"id": "arc2", "question": "Which is a gas?", "choices": {"text": ["ice", "steam", "rock", "sand"],
                                                                  "label": ["1", "2", "3", "4"]}}]))
    r = ggbatch("run", "--model", stories, "--input", arc, "--output", tmp_path / "arc.out.jsonl", "--id-field", "id",
                "--choices", "auto", "--choice-scoring", "loglikelihood")
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in map(json.loads, (tmp_path / "arc.out.jsonl").read_text().splitlines())}
    assert rows["arc1"]["answer"] in "ABC" and rows["arc2"]["answer"] in "1234", rows
    assert rows["arc2"]["answer_norm"] in "1234"
    table = tmp_path / "q.csv"
    table.write_text('questionID,question,choices\nc1,Pick a side,"[""left"", ""right""]"\n', encoding="utf-8")
    r = ggbatch("run", "--model", stories, "--input", table, "--output", tmp_path / "c.out.jsonl", "--choices", "auto")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "c.out.jsonl").read_text())["answer"] in ("left", "right")


@pytest.mark.parametrize("model, suffix", [("stories260K.gguf", "\nAnswer: "), ("llama-2-tiny-random.gguf",
                                                                                  "\nAnswer:")])
def test_logits_path_answers_as_the_grammar_path_on_single_token_choices(model, suffix):
    """The same questions, choices answered from the first position's logits and generated under
    the choice grammar: where the grammar answered in one token (here all of them), the same."""
    from ggbatch.workers.llama.engine import LlamaEngine
    from ggbatch.workers.llama.model_runner import Tokenizer
    from ggbatch.workers.protocol import AnswerSpec, EngineConfig, GenerationParams, Question

    path = str(require(MODELS / model, "a real vocabulary's one-token letters"))
    needs = "real MMLU and LSAT-RC questions"
    records = [json.loads(x) for x in require(MMLU, needs).read_text().splitlines()[:24]]
    records += [json.loads(x) for x in require(LSAT, needs).read_text().splitlines()[:6]]
    tok = Tokenizer(path)
    prompts = {r["questionID"]: tok.tokenize(r["question"][-1000:] + suffix) for r in records}
    tok.close()

    def run(from_logits):
        config = EngineConfig(model_path=path, n_threads=1, slots=8, n_ctx_seq=1400, n_batch=512,
                              generation=GenerationParams(4), kv_unified=False)
        engine = LlamaEngine(config, 0)
        for r in records:
            spec = AnswerSpec(tuple(r["choices"]), logprobs=True, choice_logits=from_logits)
            engine.add(Question(r["questionID"], prompts[r["questionID"]], 1, GenerationParams(4, answer=spec)))
        out = {}
        while engine.n_unfinished:
            out.update((a.qid, a) for a in engine.step())
        stats = engine.stats()
        engine.close()
        return out, stats

    (logits, st_logits), (grammar, st_grammar) = run(True), run(False)
    assert st_logits["choice_answers"] == 30 and st_logits["grammar_tokens"] == 0
    assert st_grammar["choice_answers"] == 0 and st_grammar["grammar_tokens"] >= 30
    one_token = [qid for qid, a in grammar.items() if a.completion_tokens == 1]
    assert len(one_token) == 30
    assert {qid: logits[qid].text for qid in one_token} == {qid: grammar[qid].text for qid in one_token}
    assert all(a.choice_logprobs is not None and grammar[a.qid].choice_logprobs is None for a in logits.values())


def test_json_schema_job_every_answer_validates_also_batch_invariant(tmp_path, stories, gsm8k_file):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    outs = []
    for slots in (1, 8):
        out = tmp_path / f"a{slots}.json"
        r = ggbatch("run", "--model", stories, "--input", gsm8k_file(12), "--output", out, "--json-schema", schema,
                    "--max-tokens", "120", "--batch-invariant", "--slots", slots)
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
        for row in json.loads(out.read_text()):
            jsonschema.validate(json.loads(row["answer"]), SCHEMA)
    assert outs[0] == outs[1]  # a grammar masks per sequence: batch-mates still do not matter


def test_a_stop_string_does_not_cut_an_answer_held_to_choices_or_a_schema(tmp_path, stories, demo_model):
    """A stop string inside a constrained answer would leave one that is neither a choice nor valid
    JSON: the choices or the grammar say where it ends."""
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"questionID": "c1", "question": "Which?", "choices": ["red", "green", "blue"]}\n'
                         '{"questionID": "c2", "question": "Pick", "choices": ["yes", "no"]}\n')
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "a.jsonl", "--choices",
                "auto", "--stop", "e", "--max-tokens", "6", "-q")  # generated under the choices' grammar
    assert r.returncode == 0, r.stderr
    rows = answers(tmp_path / "a.jsonl")
    assert rows["c1"]["answer"] in ("red", "green", "blue") and rows["c2"]["answer"] in ("yes", "no"), rows
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"questionID": "c0", "question": "Which 0?"}\n{"questionID": "c1", "question": "Which 1?"}\n')
    r = ggbatch("run", "--model", stories, "--input", plain, "--output", tmp_path / "b.jsonl", "--json-schema",
                schema, "--stop", "}", "--max-tokens", "16", "-q")
    assert r.returncode == 0, r.stderr
    assert all(isinstance(json.loads(row["answer"])["a"], int) for row in answers(tmp_path / "b.jsonl").values())


def test_an_answer_held_to_a_schema_cut_by_the_context_says_to_raise_the_context(tmp_path, demo_model):
    """Not max_tokens: the context filled. The row's error and the run's summary say what to raise."""
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"questionID": "w0", "question": "Write"}\n{"questionID": "w1", "question": "Say"}\n')
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp_path / "a.jsonl",
                "--n-ctx", 48, "--max-tokens", 100, "--json-schema", '{"type": "string"}', "--progress", "off")
    assert r.returncode == 1, r.stderr
    why = ("the context filled before the answer was complete (it must be complete under its grammar): "
           "raise model.n_ctx (--n-ctx)")
    rows = answers(tmp_path / "a.jsonl")
    assert [row["error"] for row in rows.values()] == [why, why]
    assert ("2 answers held to choices or a grammar were cut before they were complete and failed (first: w0: "
            f"{why})") in r.stderr


def test_gbnf_job_answers_match_the_grammar_sampled_too(tmp_path, stories, gsm8k_file):
    grammar = 'root ::= ("yes" | "no") ", because " [a-z]+ (" " [a-z]+)? "."'
    out = tmp_path / "a.jsonl"
    r = ggbatch("run", "--model", stories, "--input", gsm8k_file(12), "--output", out, "--grammar", grammar,
                "--max-tokens", "48", "--temperature", "0.9")
    assert r.returncode == 0, r.stderr
    got = [a["answer"] for a in answers(out).values()]
    assert got and all(re.fullmatch(r"(yes|no), because [a-z]+( [a-z]+)?\.", a) for a in got), got


def test_openai_lines_response_format_is_enforced_and_a_bad_schema_is_that_lines_error(tmp_path, stories):
    def chat(cid, fmt, max_tokens=120):
        return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "Tell me about Lily."}], "max_tokens": max_tokens,
                         "response_format": fmt}}
    schema_fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/nowhere"}}}
    lines = [chat("schema", schema_fmt), chat("object", {"type": "json_object"}), chat("bad", bad),
             chat("cut", schema_fmt, max_tokens=3), chat("free", {"type": "text"}, max_tokens=5)]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    r = ggbatch("run", "--model", stories, "--input", batch, "--output", out)
    assert r.returncode == 1, r.stderr  # the bad line failed, the rest answered
    parsed = parse_output(out.read_text())
    content = {cid: body.choices[0].message.content for cid, (_, body) in parsed.items() if body is not None}
    assert parsed["schema"][1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(content["schema"]), SCHEMA)
    # any JSON object, unbounded: this tiny model may ramble in a string until max_tokens cuts it
    if parsed["object"][1] is not None:
        assert isinstance(json.loads(content["object"]), dict)
    else:
        assert "before the answer was complete" in parsed["object"][0].error.message
    assert "body.response_format: json_schema.schema" in parsed["bad"][0].error.message
    # cut by max_tokens before its JSON was complete: failed, never written as an answer
    assert parsed["cut"][1] is None and "before the answer was complete" in parsed["cut"][0].error.message
    cut_first = "object" if parsed["object"][1] is None else "cut"  # the first in input order
    assert f"held to choices or a grammar {'were' if cut_first == 'object' else 'was'} cut before" in r.stderr
    assert f"complete and failed (first: {cut_first}: " in r.stderr
    assert "not enforced" not in r.stderr


@pytest.mark.parametrize("flags, said", [
    (["--grammar", "root ::= missing"],
     "answer.grammar: not a grammar llama.cpp can use: \"Undefined rule identifier 'missing'\""),
    (["--grammar", 'root ::= [a-'], "answer.grammar: not a grammar llama.cpp can use: 'unexpected end of input'"),
    (["--json-schema", '{"type": "object", "properties": {"a": {"$ref": "#/x/y"}}}'],
     "answer.json_schema: cannot turn this JSON schema into a grammar"),
    (["--json-schema", '{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}'],
     "answer.json_schema: the grammar cannot enforce 'minimum' (at properties.n)"),
    (["--json-schema", '{"type": "string", "format": "email", "maxLength": 8}'],  # was run: '" Anna,"', exit 0
     "answer.json_schema: the grammar cannot enforce 'format': 'email', so answers could break the schema"),
])
def test_a_bad_grammar_or_schema_is_exit_2_before_any_worker(tmp_path, demo_model, questions_file, flags, said):
    out = tmp_path / "a.json"
    r = ggbatch("run", "--model", demo_model, "--input", questions_file(4), "--output", out, *flags, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith(f"ggbatch: error: {said}"), r.stderr
    assert not out.exists() and not (tmp_path / "a.json.journal.jsonl").exists()


def test_resume_refuses_answers_made_under_other_choices(tmp_path, demo_model, questions_file):
    q = questions_file(6)
    out = tmp_path / "a.json"
    assert ggbatch("run", "--model", demo_model, "--input", q, "--output", out, "--choices", "A,B,C,D").returncode == 0
    r = ggbatch("run", "--model", demo_model, "--input", q, "--output", out, "--choices", "A,B")
    assert r.returncode == 2 and "'answer.choices' changed since the journaled run" in r.stderr
    r = ggbatch("run", "--model", demo_model, "--input", q, "--output", out, "--choices", "A,B", "--fresh")
    assert r.returncode == 0 and {a["answer"] for a in json.loads(out.read_text())} <= {"A", "B"}


def test_the_choice_logprobs_example_of_answers_md_reproduces(tmp_path):
    """docs/guide/answers.md quotes one answers row of TinyStories-656K with its choice_logprobs
    and the command that wrote it: that command, run, writes that row."""
    page = (ROOT / "docs" / "guide" / "answers.md").read_text(encoding="utf-8")
    row = re.search(r'`(\{"questionID": "mmlu-abstract_algebra-1", "answer": "B", "choice_logprobs": [^`]*)`', page)
    command = re.search(r"`ggbatch (run --model TinyStories-656K-Q8_0\.gguf[^`]*)`", page)
    assert row and command, "answers.md no longer holds the TinyStories-656K example and its command"
    model = require(MODELS / "TinyStories-656K-Q8_0.gguf", "the model of answers.md's example")
    questions, _ = sample(MMLU, 1, tmp_path)
    paths = {"TinyStories-656K-Q8_0.gguf": model, "mmlu.jsonl": questions, "a.jsonl": tmp_path / "a.jsonl"}
    r = ggbatch(*(paths.get(word, word) for word in command.group(1).split()))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.jsonl").read_text(encoding="utf-8") == row.group(1) + "\n"
