"""Models named by Hugging Face names. This machine has no network: the tests build a real hub
cache (huggingface_hub's layout: blobs, refs/main, snapshots/<commit>/FILE) holding
the demo model under a few file names and resolve names from it offline through the library."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from ggbatch.runner.config.job_file import load_job_file
from ggbatch.runner.errors import ModelError
from ggbatch.runner.model.hub import HubRef, is_hub_name, parse_hub_name, pick_file, split_parts
from helpers import ggbatch as cli

pytestmark = pytest.mark.timeout(240)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


# -- names and the file rule (pure) -------------------------------------------------------------


@pytest.mark.parametrize("name, ref", [
    ("hf:owner/repo/model-Q4_K_M.gguf",
     HubRef("hf:owner/repo/model-Q4_K_M.gguf", "owner/repo", filename="model-Q4_K_M.gguf")),
    ("hf:owner/repo/sub/dir/m.gguf", HubRef("hf:owner/repo/sub/dir/m.gguf", "owner/repo", filename="sub/dir/m.gguf")),
    ("owner/repo:Q4_K_M", HubRef("owner/repo:Q4_K_M", "owner/repo", quant="Q4_K_M")),
    ("hf:owner/Repo-GGUF:q8_0", HubRef("hf:owner/Repo-GGUF:q8_0", "owner/Repo-GGUF", quant="q8_0")),
    ("hf:owner/repo", HubRef("hf:owner/repo", "owner/repo")),
    # a link copied from the Hub: the file's download or its page, at a branch or a commit
    ("https://huggingface.co/owner/repo/resolve/main/sub/m%20Q4.gguf?download=true",
     HubRef("https://huggingface.co/owner/repo/resolve/main/sub/m%20Q4.gguf?download=true", "owner/repo",
            filename="sub/m Q4.gguf", revision="main")),
    ("https://hf.co/owner/repo/blob/0123abc/m.gguf", HubRef("https://hf.co/owner/repo/blob/0123abc/m.gguf",
                                                             "owner/repo", filename="m.gguf", revision="0123abc")),
    ("https://example.com/owner/repo/resolve/main/m.gguf", None),
    ("models/m.gguf", None), ("m.gguf", None), ("/abs/path:with/colon.gguf", None), ("demo", None),
])
def test_parse_names(name, ref):
    assert parse_hub_name(name) == ref
    assert is_hub_name(name) is (ref is not None)


@pytest.mark.parametrize("name", ["hf:", "hf:owner", "hf:owner/", "hf:/repo/x.gguf", "hf:a/b/"])
def test_malformed_hf_names(name):
    with pytest.raises(ModelError, match="expected hf:OWNER/REPO/FILE.gguf"):
        parse_hub_name(name)


FILES = ["README.md", "Model-7B-Q4_K_M.gguf", "Model-7B-q8_0.gguf", "Model-7B-F16-00001-of-00002.gguf",
         "Model-7B-F16-00002-of-00002.gguf", "mmproj-Model-7B-F16.gguf", "Model-7B-Q4_K_S.gguf"]


@pytest.mark.parametrize("quant, expected", [
    ("Q4_K_M", "Model-7B-Q4_K_M.gguf"), ("q4_k_m", "Model-7B-Q4_K_M.gguf"),  # case-insensitive
    ("Q8_0", "Model-7B-q8_0.gguf"), ("Q4_K_S", "Model-7B-Q4_K_S.gguf"),
    ("F16", "Model-7B-F16-00001-of-00002.gguf"),  # the first part; mmproj is not a model
    (None, "Model-7B-Q4_K_M.gguf"),  # llama.cpp's default
])
def test_pick_file_like_llama_cpp(quant, expected):
    assert pick_file(FILES, HubRef("n", "o/r", quant=quant)) == expected


def test_pick_file_defaults_and_errors():
    assert pick_file(["a-Q8_0.gguf", "b.gguf"], HubRef("n", "o/r")) == "a-Q8_0.gguf"
    assert pick_file(["only.gguf", "mmproj-x.gguf"], HubRef("n", "o/r")) == "only.gguf"
    with pytest.raises(ModelError, match=r"^n: no GGUF file of o/r matches Q4_K; it has Model-7B-Q4_K_M.gguf, "):
        pick_file(FILES, HubRef("n", "o/r", quant="Q4_K"))  # Q4_K is followed by _M there, not . or -
    with pytest.raises(ModelError,
                       match=r"2 files match Q4_K_M: a/m-Q4_K_M.gguf, b/m-Q4_K_M.gguf; name one as hf:o/r/FILE"):
        pick_file(["a/m-Q4_K_M.gguf", "b/m-Q4_K_M.gguf"], HubRef("n", "o/r", quant="Q4_K_M"))
    with pytest.raises(ModelError, match="no GGUF file of o/r matches Q4_K_M or Q8_0; it has x.gguf, y.gguf"):
        pick_file(["x.gguf", "y.gguf"], HubRef("n", "o/r"))
    with pytest.raises(ModelError, match="o/r has no GGUF model file"):
        pick_file(["README.md"], HubRef("n", "o/r", quant="F32"))


def test_split_parts():
    assert split_parts("m-F16-00001-of-00003.gguf") == [f"m-F16-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert split_parts("m-F16.gguf") == ["m-F16.gguf"]


def test_job_file_keeps_hub_names_and_joins_paths(tmp_path):
    job = tmp_path / "job.yaml"
    for model, expected in [("hf:o/r/m.gguf", "hf:o/r/m.gguf"), ("o/r:Q4_K_M", "o/r:Q4_K_M"),
                            ("m.gguf", str(tmp_path / "m.gguf"))]:
        job.write_text(f"model: {model}\ninput: q.jsonl\noutput: a.json\n")
        assert load_job_file(str(job))["model"] == expected


# -- resolution through a real hub cache, offline -----------------------------------------------


def add_to_hub_cache(cache: Path, repo_id: str, files: dict, commit: str = COMMIT) -> Path:
    """Lay files out as huggingface_hub caches a download: content-addressed blobs, refs/main
    naming the commit, and the snapshot's file names as relative symlinks to the blobs."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name, source in files.items():
        blob = repo / "blobs" / hashlib.sha256(Path(source).read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(source, blob)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo / "snapshots" / commit


@pytest.fixture
def hub(tmp_path, demo_model):
    cache = tmp_path / "hub"
    snapshot = add_to_hub_cache(cache, "owner/repo", {"stories260K.gguf": demo_model,
                                                      "stories260K-F32.gguf": demo_model,
                                                      "mmproj-stories260K-F32.gguf": demo_model})
    add_to_hub_cache(cache, "owner/two", {"a/m-Q8_0.gguf": demo_model, "b/m-Q8_0.gguf": demo_model})
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return cache, snapshot, env


def resolve(name, env, hide_hub=False):
    """resolve_model(name) in a fresh process, as `ggbatch run` calls it; hide_hub makes
    `import huggingface_hub` fail there, as where the extra is not installed."""
    code = ("import sys\n" + ("sys.modules['huggingface_hub'] = None\n" if hide_hub else "") +
            "from ggbatch.runner.model.identity import resolve_model\nprint(resolve_model(sys.argv[1]))\n")
    return subprocess.run([sys.executable, "-c", code, name], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_names_resolve_offline_from_the_cache(hub):
    cache, snapshot, env = hub
    for name, file in [("hf:owner/repo/stories260K.gguf", "stories260K.gguf"),
                       ("owner/repo:F32", "stories260K-F32.gguf"), ("owner/repo:f32", "stories260K-F32.gguf"),
                       ("hf:owner/repo:F32", "stories260K-F32.gguf")]:
        r = resolve(name, env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(snapshot / file)


def test_a_hub_link_resolves_as_its_hf_name_does(hub):
    """The link a user copies from the file's page was a model file not found."""
    cache, snapshot, env = hub
    for link in ("https://huggingface.co/owner/repo/resolve/main/stories260K.gguf?download=true",
                 f"https://huggingface.co/owner/repo/blob/{COMMIT}/stories260K.gguf"):
        r = resolve(link, env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(snapshot / "stories260K.gguf")


def test_other_links_are_said_to_be_links(tmp_path):
    """A link to a model or a question file elsewhere was 'file not found', as if a path."""
    for flag, link, what, file in (("--model", "https://example.com/m.gguf", "the model", "model file"),
                                   ("--input", "https://example.com/q.jsonl", "the questions", "input file")):
        args = {"--model": "demo", "--input": tmp_path / "q.jsonl", "--output": tmp_path / "a.json", flag: link}
        r = cli("run", *[str(x) for pair in args.items() for x in pair], "-q")
        assert (r.returncode, r.stderr) == (2, f"ggbatch: error: {link}: {file} not found (a link: ggbatch reads "
                                               f"{what} from a local file; download it first (curl -LO URL) and give "
                                               "its path)\n")
    r = cli("run", "--model", "demo", "--input", "hf://datasets/openai/gsm8k", "--output", tmp_path / "a.json", "-q")
    assert r.returncode == 2 and "(a Hugging Face dataset: ggbatch reads the questions from a local file; write the " \
                                 "split as JSON Lines first: datasets.load_dataset(NAME, split=SPLIT)" in r.stderr


def test_offline_misses_are_one_line_errors(hub):
    cache, _, env = hub
    r = resolve("hf:owner/repo/absent.gguf", env)
    assert f"hf:owner/repo/absent.gguf: not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set" in r.stderr
    r = resolve("owner/other:Q4_K_M", env)
    assert (f"owner/other:Q4_K_M: owner/other is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set"
            in r.stderr)
    r = resolve("owner/two:Q8_0", env)
    assert "owner/two:Q8_0: 2 files match Q8_0: a/m-Q8_0.gguf, b/m-Q8_0.gguf" in r.stderr
    r = resolve("owner/repo:Q4_K_M", env)
    assert "no GGUF file of owner/repo matches Q4_K_M; it has stories260K-F32.gguf, stories260K.gguf" in r.stderr
    r = resolve("owner/repo:F32", env, hide_hub=True)
    assert ("owner/repo:F32: a Hugging Face model name needs the huggingface_hub package: pip install 'ggbatch[hf]'"
            in r.stderr)


def unreachable(env):
    """env with the Hub at a loopback port nobody listens on (connections are refused at once;
    huggingface_hub tries 5 times more, about 24 s) and not offline."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    del env["HF_HUB_OFFLINE"]
    env.pop("HF_HUB_VERBOSITY", None)
    return env


def test_unreachable_hub_falls_back_to_the_cache(hub):
    _, snapshot, env = hub
    env = unreachable(env)
    r = resolve("hf:owner/repo/stories260K.gguf", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(snapshot / "stories260K.gguf")


def ggbatch_run(env, *args):
    return cli("run", *args, env=env)


def test_quiet_keeps_the_hubs_retry_warnings_off_stderr(hub, tmp_path, questions_file):
    """-q is errors only: huggingface_hub's "Retrying in 8s [Retry 4/5]." lines are not."""
    cache, _, env = hub
    r = ggbatch_run(unreachable(env), "--model", "hf:owner/repo/absent.gguf", "--input", questions_file(3),
                    "--output", tmp_path / "a.json", "-q")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"ggbatch: error: hf:owner/repo/absent.gguf: not in the Hugging Face cache "
                                     f"({cache}) and the Hub cannot be reached"]


@pytest.mark.model
@pytest.mark.parametrize("name, file", [("hf:owner/repo/stories260K.gguf", "stories260K.gguf"),
                                        ("owner/repo:F32", "stories260K-F32.gguf")])
def test_run_with_a_hub_name_offline(hub, tmp_path, questions_file, name, file):
    _, snapshot, env = hub
    out, report = tmp_path / "a.json", tmp_path / "r.json"
    r = ggbatch_run(env, "--model", name, "--input", questions_file(3), "--output", out, "--max-tokens", 8,
                    "--report", report)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(out.read_text())) == 3
    assert json.loads(report.read_text())["model"]["path"] == str(snapshot / file)
    # a missing file stops the run before anything starts: exit 2, one line, no answers file
    r = ggbatch_run(env, "--model", "owner/repo:Q2_K", "--input", questions_file(3), "--output", tmp_path / "b.json")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "matches Q2_K" in r.stderr
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("written, said", [
    ("model: nope.gguf", "{job}: model: {folder}/nope.gguf: model file not found\n"),
    # a bare OWNER/REPO, joined to the job's folder as a path: said how to name it on the Hub, as --model's is
    ("model: Qwen/Qwen2-GGUF", "{job}: model: {folder}/Qwen/Qwen2-GGUF: model file not found (a Hugging Face "
                               "repository? write hf:Qwen/Qwen2-GGUF, or Qwen/Qwen2-GGUF:QUANT such as "
                               "Qwen/Qwen2-GGUF:Q4_K_M)\n"),
    ("model: {path: job.yaml}", "{job}: model.path: {folder}/job.yaml: not a GGUF file (no GGUF magic at the start)"),
    ("model: hf:owner/repo/absent.gguf", "{job}: model: hf:owner/repo/absent.gguf: not in the Hugging Face cache "
                                         "({cache}) and HF_HUB_OFFLINE is set"),
])
def test_a_model_a_job_file_names_is_refused_naming_the_file_and_its_key(hub, tmp_path, questions_file, written,
                                                                         said):
    """The job key's refusal read as the flag's: the user was not told it came from the job file."""
    cache, _, env = hub
    job = tmp_path / "job.yaml"
    job.write_text(f"{written}\ninput: {questions_file(3)}\noutput: a.json\n")
    said = said.format(job=job, folder=tmp_path, cache=cache)
    for command in (("run", job), ("tune", job)):
        r = cli(*command, env=env)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"ggbatch: error: {said}"), r.stderr
    for command in (("run", job, "--model", "other.gguf"), ("tune", job, "--model", "other.gguf")):
        r = cli(*command, env=env)  # the flag's model, which the user typed there: named as typed
        assert r.returncode == 2 and r.stderr == "ggbatch: error: other.gguf: model file not found\n", r.stderr
    assert not (tmp_path / "a.json").exists()


def test_a_bare_repository_name_not_found_as_a_path_says_how_to_name_it_on_the_hub(tmp_path, monkeypatch):
    """`--model Qwen/Qwen2-0.5B-Instruct-GGUF` (llama.cpp's -hf takes it so) is a path to ggbatch:
    'model file not found' left the user guessing."""
    from ggbatch.runner.model.identity import resolve_model

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match=r"^Qwen/Qwen2-GGUF: model file not found \(a Hugging Face repository\? "
                                         r"write hf:Qwen/Qwen2-GGUF, or Qwen/Qwen2-GGUF:QUANT such as "
                                         r"Qwen/Qwen2-GGUF:Q4_K_M\)$"):
        resolve_model("Qwen/Qwen2-GGUF")
    for path in ("models/m.gguf", "./Qwen/Qwen2-GGUF", "m.gguf"):  # paths, said as paths
        with pytest.raises(ModelError, match=r": model file not found$"):
            resolve_model(path)
