"""Tests for runner.modelgen: random llama GGUFs that llama.cpp really loads and runs."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import gguf
import pytest

from conftest import MODELS
from ggbatch.runner.model.make import modelgen as mg
from helpers import ggbatch

QWEN2_VOCAB = MODELS / "ggml-vocab-qwen2.gguf"
TINY = mg.ModelShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=512)
# k-quants need rows that are a multiple of 256 (n_embd and n_ff here), or llama.cpp falls back.
KQUANT_SHAPE = mg.ModelShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=512)
TEXT = "Hello world, 12345 café!"


pytestmark = [pytest.mark.model]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(path: Path, **kwargs):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False, **kwargs)


def tensor_types(path: Path) -> dict[str, gguf.GGMLQuantizationType]:
    return {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mg.ensure_demo_model(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def demo_llm(demo_path: Path):
    return load(demo_path)


def test_shapes() -> None:
    assert {"demo", "bench-28x1024", "qwen3-0.6b-like", "qwen3-1.7b-like"} <= set(mg.SHAPES)
    bench = mg.SHAPES["bench-28x1024"]
    assert (bench.n_layer, bench.n_embd, bench.n_head, bench.n_head_kv, bench.n_ff, bench.n_ctx) == (
        28, 1024, 16, 8, 3072, 4096)
    assert bench.head_dim == 64
    assert mg.SHAPES["qwen3-1.7b-like"].n_ctx == 40960
    # As the real Qwen3-0.6B/1.7B; demo and bench stay untied so their files and figures hold.
    assert {name for name, shape in mg.SHAPES.items() if shape.tied_embeddings} == {
        "qwen3-0.6b-like", "qwen3-1.7b-like"}
    with pytest.raises(ValueError):
        mg.ModelShape(n_layer=1, n_embd=64, n_head=5, n_head_kv=1, n_ff=64, n_ctx=64)


def test_demo_tokenizer_layout() -> None:
    tok = mg.build_demo_vocab()
    assert tok == mg.build_demo_vocab()  # deterministic
    assert tok.model == "llama"
    assert tok.tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tok.tokens[3] == "<0x00>" and tok.tokens[258] == "<0xFF>"
    assert set(tok.token_types[3:259]) == {gguf.TokenType.BYTE}
    assert "\u2581the" in tok.tokens and "\u2581model" in tok.tokens
    assert len(set(tok.tokens)) == tok.vocab_size == len(tok.scores) == len(tok.token_types)
    im_end = tok.tokens.index("<|im_end|>")
    assert tok.token_types[im_end] == tok.token_types[tok.tokens.index("<|im_start|>")] == gguf.TokenType.CONTROL
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (1, 2, im_end)
    assert "add_generation_prompt" in tok.chat_template


def test_build_is_deterministic(tmp_path: Path) -> None:
    a = mg.make_model(tmp_path / "a.gguf", "demo", seed=3)
    b = mg.make_model(tmp_path / "b.gguf", "demo", seed=3)
    c = mg.make_model(tmp_path / "c.gguf", "demo", seed=4)
    assert sha256(a) == sha256(b) != sha256(c)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "c.gguf"]  # no temp left


def test_metadata_and_tensors(tmp_path: Path) -> None:
    path = mg.write_random_llama_gguf(tmp_path / "m.gguf", TINY, mg.build_demo_vocab(), seed=0)
    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 2 and meta["llama.attention.head_count_kv"] == 2
    assert meta["llama.vocab_size"] == mg.build_demo_vocab().vocab_size
    types = {t.name: (t.tensor_type, tuple(t.shape)) for t in reader.tensors}
    assert len(types) == 3 + 9 * TINY.n_layer
    assert types["blk.1.attn_k.weight"] == (gguf.GGMLQuantizationType.F16, (64, 32))  # ggml order: ne
    assert types["blk.0.ffn_norm.weight"][0] == gguf.GGMLQuantizationType.F32


def tensor_names(path: Path) -> set[str]:
    return {t.name for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def tied_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mg.make_model(tmp_path_factory.mktemp("tied") / "tied.gguf", "demo", tie_embeddings=True)


def test_tied_model_has_no_output_layer(tied_demo: Path, tmp_path: Path) -> None:
    untied = mg.make_model(tmp_path / "untied.gguf", "demo")
    assert "output.weight" in tensor_names(untied)
    assert tensor_names(tied_demo) == tensor_names(untied) - {"output.weight"}
    assert tied_demo.stat().st_size < untied.stat().st_size
    reader = gguf.GGUFReader(tied_demo)
    assert reader.fields["general.name"].contents() == "ggbatch-random-demo-tied"  # says it was forced
    # The embedding rows now double as output rows: special and byte tokens' rows are zero, the rest not.
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight").data
    silent = [t != gguf.TokenType.NORMAL for t in mg.build_demo_vocab().token_types]
    assert not embd[silent].any() and all(embd[[not s for s in silent]].any(axis=1))


def test_make_model_flag_ties(tmp_path: Path) -> None:
    from ggbatch.runner.cli import build_parser
    from ggbatch.runner.tools.commands import cmd_make_model

    def make_model(*argv: str) -> int:
        return cmd_make_model(build_parser().parse_args(["make-model", *argv]))

    assert make_model("--shape", "demo", "--tie-embeddings", str(tmp_path / "t.gguf")) == 0
    done = ggbatch("make-model", tmp_path / "any.gguf")  # no shape: refused, not 675 MiB of the benchmark's
    assert done.returncode == 2 and "--shape" in done.stderr and not (tmp_path / "any.gguf").exists()
    assert make_model("--shape", "demo", str(tmp_path / "u.gguf")) == 0
    assert "output.weight" not in tensor_names(tmp_path / "t.gguf")
    assert "output.weight" in tensor_names(tmp_path / "u.gguf")  # without the flag, the shape decides


@pytest.mark.timeout(120)
def test_tied_model_generates_words(tied_demo: Path) -> None:
    from itertools import islice

    llm = load(tied_demo)
    out = llm.create_completion("Hello", max_tokens=8, temperature=0)
    assert out["usage"]["completion_tokens"] == 8 and out["choices"][0]["finish_reason"] == "length"
    # Greedy never picks a special or byte token, even though their rows are also their inputs.
    types = mg.build_demo_vocab().token_types
    prompt = llm.tokenize(b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", special=True)
    generated = list(islice(llm.generate(prompt, temp=0), 16))
    assert [types[t] for t in generated] == [gguf.TokenType.NORMAL] * 16
    # and not the prompt's last token again and again ('????????????' at the untied shape's scale)
    assert len(set(generated)) > 4, llm.detokenize(generated)


def test_unknown_names_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="known shapes: demo"):
        mg.make_model(tmp_path / "x.gguf", "no-such-shape")
    with pytest.raises(ValueError, match="unknown quantization type"):
        mg.make_model(tmp_path / "x.gguf", "demo", quant="q9_z")
    with pytest.raises(ValueError, match="q4_k_m"):
        mg.quantize(tmp_path / "x.gguf", tmp_path / "y.gguf", "q4_k_xl")
    with pytest.raises(ValueError):
        mg.write_random_llama_gguf(tmp_path / "x.gguf", TINY, mg.build_demo_vocab(), ftype="q8_0")
    assert list(tmp_path.iterdir()) == []


def test_ensure_demo_model_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = mg.ensure_demo_model()
    assert path == tmp_path / "xdg" / "ggbatch" / mg.DEMO_MODEL_NAME
    assert "v" in path.stem  # versioned name: a changed generator never reuses a stale file
    mtime = path.stat().st_mtime_ns
    assert mg.ensure_demo_model() == path and path.stat().st_mtime_ns == mtime  # built once


def test_ensure_demo_model_race(tmp_path: Path) -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(mg.ensure_demo_model(tmp_path))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 4
    assert [p.name for p in tmp_path.iterdir()] == [mg.DEMO_MODEL_NAME]
    assert sha256(results[0]) == sha256(mg.make_model(tmp_path / "ref.gguf", "demo", ftype="f32"))


@pytest.mark.timeout(120)
def test_demo_model_tokenizes(demo_llm) -> None:
    tokens = demo_llm.tokenize(TEXT.encode())
    assert tokens[0] == 1  # BOS
    assert demo_llm.detokenize(tokens).decode() == TEXT
    im_start = mg.build_demo_vocab().tokens.index("<|im_start|>")
    assert demo_llm.tokenize(b"<|im_start|>", add_bos=False, special=True) == [im_start]
    assert len(demo_llm.tokenize(b"<|im_start|>", add_bos=False, special=False)) > 1
    assert len(demo_llm.tokenize(b"the", add_bos=False)) == 1  # SPM adds the "▁" prefix: "▁the"


@pytest.mark.timeout(120)
def test_demo_model_generates(demo_llm) -> None:
    import llama_cpp

    out = demo_llm.create_completion("Hello", max_tokens=8, temperature=0)
    # Special tokens have zero output rows, so greedy decoding never stops early on a random EOS.
    assert out["usage"]["completion_tokens"] == 8 and out["choices"][0]["finish_reason"] == "length"
    assert out["choices"][0]["text"].strip()
    vocab = llama_cpp.llama_model_get_vocab(demo_llm.model)
    assert llama_cpp.llama_vocab_eot(vocab) == mg.build_demo_vocab().eot_id
    assert demo_llm.metadata["tokenizer.chat_template"] == mg.build_demo_vocab().chat_template
    chat = demo_llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    assert chat["choices"][0]["message"]["role"] == "assistant"


@pytest.fixture(scope="module")
def qwen2_tokenizer() -> mg.GGUFVocab:
    if not QWEN2_VOCAB.is_file():
        pytest.skip(f"needs a real vocabulary (Qwen2's): {QWEN2_VOCAB} is absent")
    return mg.vocab_from_gguf(QWEN2_VOCAB)  # GGUFReader parses 300k strings: ~8 s


@pytest.mark.timeout(120)
def test_model_with_real_vocab(qwen2_tokenizer: mg.GGUFVocab, tmp_path: Path) -> None:
    assert qwen2_tokenizer.model == "gpt2" and qwen2_tokenizer.pre == "qwen2"
    path = mg.write_random_llama_gguf(tmp_path / "q.gguf", TINY, qwen2_tokenizer, seed=0)
    llm = load(path)
    ref = load(QWEN2_VOCAB, vocab_only=True)
    text = "Hello world, 12345 café! <|im_start|>user\nHi<|im_end|>"
    assert llm.n_vocab() == qwen2_tokenizer.vocab_size == 151936
    for special in (False, True):
        assert llm.tokenize(text.encode(), special=special) == ref.tokenize(text.encode(), special=special)
    assert llm.metadata["tokenizer.chat_template"] == ref.metadata["tokenizer.chat_template"]
    assert llm.create_completion("Hello", max_tokens=4, temperature=0)["usage"]["completion_tokens"] > 0


@pytest.mark.timeout(120)
def test_quantize_q4_k_m(tmp_path: Path) -> None:
    src = mg.write_random_llama_gguf(tmp_path / "f16.gguf", KQUANT_SHAPE, mg.build_demo_vocab(), seed=0)
    dst = mg.quantize(src, tmp_path / "q4.gguf", "q4_k_m")
    assert dst.stat().st_size < src.stat().st_size / 2
    assert tensor_types(dst)["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q4_K
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f16.gguf", "q4.gguf"]
    out = load(dst).create_completion("Hello", max_tokens=8, temperature=0)
    assert out["usage"]["completion_tokens"] > 0


@pytest.mark.timeout(120)
def test_make_model_quantized_with_fallback(tmp_path: Path) -> None:
    # 64-wide rows cannot hold 256-element k-quant blocks: llama.cpp falls back to another type.
    path = mg.make_model(tmp_path / "demo-q4.gguf", "demo", quant="q4_k_m")
    assert [p.name for p in tmp_path.iterdir()] == ["demo-q4.gguf"]
    assert tensor_types(path)["blk.0.attn_q.weight"] != gguf.GGMLQuantizationType.F16
    q8 = mg.make_model(tmp_path / "demo-q8.gguf", "demo", quant="q8_0")
    assert tensor_types(q8)["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert load(path).create_completion("Hi", max_tokens=4, temperature=0)["usage"]["completion_tokens"] > 0


@pytest.mark.timeout(120)
def test_quantize_failure_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf")
    with pytest.raises(RuntimeError, match="failed"):
        mg.quantize(tmp_path / "broken.gguf", tmp_path / "out.gguf", "q8_0")
    assert [p.name for p in tmp_path.iterdir()] == ["broken.gguf"]


@pytest.mark.timeout(120)
def test_make_model_writes_through_a_link_and_refuses_streams_and_its_vocab(tmp_path: Path) -> None:
    real, link = tmp_path / "real.gguf", tmp_path / "link.gguf"
    real.write_text("old")
    link.symlink_to("real.gguf")
    done = ggbatch("make-model", "--shape", "demo", link)
    assert done.returncode == 0 and "wrote " + str(link) in done.stdout  # the name given, not its target
    assert link.is_symlink() and real.read_bytes()[:4] == b"GGUF"  # the link kept, its target written
    stdout_link = tmp_path / "stdout_link"  # a link to the command's own stdout, never /dev/stdout itself
    stdout_link.symlink_to("/proc/self/fd/1")
    done = ggbatch("make-model", "--shape", "demo", stdout_link)
    assert done.returncode == 2 and stdout_link.is_symlink() and done.stdout == ""
    # a model's own words: it has no journal, unlike a run's answers
    assert done.stderr == (f"ggbatch: error: {stdout_link}: ggbatch writes the model whole, renamed into place, "
                           "not to standard output, a pipe or a device: give a file's path\n")
    vocab = tmp_path / "vocab.gguf"
    vocab.write_bytes(b"GGUF" + bytes(range(256)))  # refused before it is read
    before = hashlib.sha256(vocab.read_bytes()).hexdigest()
    done = ggbatch("make-model", "--shape", "demo", "--vocab", vocab, link.with_name("vocab.gguf"))
    assert done.returncode == 2 and hashlib.sha256(vocab.read_bytes()).hexdigest() == before
    assert done.stderr == (f"ggbatch: error: the model and the vocab file (--vocab) are the same file ({vocab}): "
                           "ggbatch would overwrite the vocab file; give another path\n")


@pytest.mark.timeout(120)
def test_make_model_refusals_are_one_line_naming_the_file(tmp_path: Path, demo_model: str) -> None:
    adir, q = tmp_path / "adir", tmp_path / "q.jsonl"
    adir.mkdir()
    q.write_text('{"id": "1", "question": "hi"}\n')
    short, cut = tmp_path / "short.gguf", tmp_path / "cut.gguf"
    short.write_text("hi\n")
    cut.write_bytes(Path(demo_model).read_bytes()[:3000])  # its header cut short
    cases = [
        ([adir], f"{adir}: the model is a directory, not a file"),
        # procfs takes no new file, even from root: the folder probe fails where the write would have
        (["/proc/x.gguf"], "/proc/x.gguf: the folder of the model, /proc, is not writable: No such file or directory"),
        (["--quant", "q8_0", q / "x.gguf"], f"{q / 'x.gguf'}: the folder of the model, "),
        (["--vocab", q, tmp_path / "v.gguf"], f"{q}: not a GGUF file (no GGUF magic at the start)\n"),
        # under 4 bytes (numpy's words on the array's size were the reason) and a GGUF cut short
        (["--vocab", short, tmp_path / "v.gguf"], f"{short}: not a GGUF file (no GGUF magic at the start)\n"),
        (["--vocab", cut, tmp_path / "v.gguf"], f"{cut}: the vocab file is truncated or corrupt (not a whole GGUF)\n"),
        # a folder was "vocab file not found"
        (["--vocab", adir, tmp_path / "v.gguf"], f"{adir}: the vocab file (--vocab) is a directory, not a file\n"),
    ]
    for argv, said in cases:
        done = ggbatch("make-model", "--shape", "demo", *argv)
        assert done.returncode == 2 and done.stderr.startswith("ggbatch: error: " + said), (argv, done.stderr)
        assert done.stderr.count("\n") == 1 and ".tmp" not in done.stderr
    # named, and before any work (the vocab is not read): it was numpy's "expected non-negative integer"
    done = ggbatch("make-model", "--shape", "demo", "--seed", "-1", "--vocab", q, tmp_path / "s.gguf")
    assert done.returncode == 2 and done.stderr == ("ggbatch make-model: error: argument --seed: expected an integer "
                                                    ">= 0, got '-1' (`ggbatch make-model --help` lists the options)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "cut.gguf", "q.jsonl", "short.gguf"]  # no temp file


@pytest.mark.timeout(120)
def test_make_model_help_gives_the_size_of_the_demo_model_it_writes(tmp_path: Path) -> None:
    written = ggbatch("make-model", "--shape", "demo", tmp_path / "d.gguf")  # the default: f16
    size = f"{(tmp_path / 'd.gguf').stat().st_size / 2**20:.1f} MiB"
    assert written.returncode == 0 and written.stdout.endswith(f"({size})\n")
    assert f"demo ({size})" in " ".join(ggbatch("make-model", "--help").stdout.split())
