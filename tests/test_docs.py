"""The manual: the docs site builds with no warning, and the command reference matches the parser.

`mkdocs build --strict` fails on a link to a page or anchor that does not exist, so a moved
heading cannot leave a dead link behind; the reference page is generated from the argparse help
(docs/gen_cli_reference.py) and must be regenerated when a flag changes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "docs" / "gen_cli_reference.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_docs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=150,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").is_file()
    assert (site / "reference" / "cli" / "index.html").is_file()


def test_cli_reference_matches_the_parser() -> None:
    gen = _generator()
    committed = gen.PAGE.read_text(encoding="utf-8")
    assert committed == gen.render(), (
        f"docs/reference/cli.md differs from the command line's parser: run `{gen.REGENERATE}` and commit it")


def test_cli_reference_ignores_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _generator()
    monkeypatch.setenv("COLUMNS", "40")
    narrow = gen.render()
    monkeypatch.setenv("COLUMNS", "250")
    wide = gen.render()
    assert narrow == wide
    for name in ("run", "merge", "score", "make-model", "bench", "tune", "plot"):
        assert f"## ggbatch {name}\n" in narrow


SOURCES = ("runner", "workers", "package", "jobs", "bench", "tests")
README_SECTION = re.compile(r'README,\s+"?([A-Za-z][\w\' -]*?)"?\s*[,).]')
DOCS_PAGE = re.compile(r"\bdocs/[\w./-]+?\.md\b")


def _source_texts() -> list[tuple[Path, str]]:
    paths = (path for folder in SOURCES for path in sorted((ROOT / folder).rglob("*")))
    return [(path, path.read_text(encoding="utf-8")) for path in paths
            if path.suffix in (".py", ".yaml", ".yml") and ".venv" not in path.parts]


def test_every_readme_section_and_docs_page_the_code_sends_users_to_exists() -> None:
    """Messages, help and the example job name a README section ("README, Exit codes") or a docs
    page: a section that moved to docs/ (GPU offload, Sharing the machine) must not stay named."""
    headings = {line.lstrip("#").strip().lower() for line in (ROOT / "README.md").read_text(encoding="utf-8")
                .splitlines() if line.startswith("#")}
    missing = [f"{path.relative_to(ROOT)}: README, {section}" for path, text in _source_texts()
               for section in README_SECTION.findall(text) if section.lower() not in headings]
    missing += [f"{path.relative_to(ROOT)}: {page}" for path, text in _source_texts()
                for page in DOCS_PAGE.findall(text) if not (ROOT / page).is_file()]
    assert missing == []


def test_contributing_names_every_module_that_calls_llama_cpp() -> None:
    """The page, the code and pyproject.toml's import-linter contract name the same seven modules
    that import llama_cpp (the page once named two of them)."""
    page = " ".join((ROOT / "docs" / "contributing.md").read_text(encoding="utf-8").split())
    sentence = next(s for s in page.split(". ") if "call llama.cpp" in s)
    named = set(re.findall(r"`((?:runner|workers)/[\w/]+\.py)`", sentence))
    importing = {str(p.relative_to(ROOT)) for folder in ("runner", "workers", "package")
                 for p in (ROOT / folder).rglob("*.py")
                 if re.search(r"^\s*(import|from) llama_cpp\b", p.read_text(encoding="utf-8"), re.M)}
    contract = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    allowed = {m.replace(".", "/") + ".py" for m in re.findall(r'"ggbatch\.([\w.]+) -> llama_cpp"', contract)}
    assert named == importing == allowed and len(named) == 7, (named, importing, allowed)


def test_the_keys_pipelines_says_a_pool_takes_are_keywords_it_takes() -> None:
    """The page listed "layout, sampling, prompt, answer, limits": Pool(layout=...) is refused
    as an unknown key, and no `limits` key exists."""
    from ggbatch.runner.config.keywords import check_keywords
    from ggbatch.runner.errors import ConfigError
    from ggbatch.runner.warm.overrides import POOL_OWN, SOURCE

    page = " ".join((ROOT / "docs" / "guide" / "pipelines.md").read_text(encoding="utf-8").split())
    taken, refused = re.search(r"The pool takes [^(]*\(([^)]*)\)(?:[^(]*\(([^)]*)\))?", page).groups()
    names = [n.strip(" `.") for n in taken.split(",") if n.strip(" `.")]
    assert len(names) >= 5, names
    for name in names:
        check_keywords(SOURCE, {name: None}, POOL_OWN)  # ConfigError: not a keyword Pool() takes
    for name in [n.strip(" `.") for n in (refused or "").split(",") if n.strip(" `.")]:
        with pytest.raises(ConfigError, match="is not taken here"):
            check_keywords(SOURCE, {name: None}, POOL_OWN)


def test_the_memory_page_gives_the_kv_cells_the_plan_counts() -> None:
    # It said "the shared prefix counted once" for every layout; only the unified pool does that.
    from ggbatch.workers.protocol import kv_cells

    page = " ".join((ROOT / "docs" / "guide" / "memory.md").read_text(encoding="utf-8").split())
    assert "with one stream per sequence, the default, cells = (slots + 1) × context per sequence" in page
    assert kv_cells(4, 322, 20, unified=False) == (4 + 1) * 322
    assert "in one unified pool, cells = prefix + slots × (context per sequence − prefix)" in page
    assert kv_cells(4, 322, 20, unified=True) == 20 + 4 * (322 - 20)
    assert "a batch-invariant job has at least 8 slots' streams" in page
    assert kv_cells(2, 100, 0, unified=False, batch_invariant=True) == (8 + 1) * 100
    assert "the shared prefix counted once" not in page


def test_contributing_lists_every_benchmark_script() -> None:
    """The benchmarks table named 14 of bench/'s scripts; a script it leaves out is one a reader
    of the performance pages cannot find."""
    page = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.]+\.(?:py|sh))` \|", page, re.M))
    scripts = {p.name for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts - listed == set(), sorted(scripts - listed)
