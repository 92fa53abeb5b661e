"""The repository's own checks (ruff, mypy, import-linter), so that `pytest` alone fails on a
regression; .ci/run runs them too, by name."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return found


@pytest.mark.timeout(120)
def test_ruff_is_clean():
    r = subprocess.run([tool("ruff"), "check", "runner", "workers", "package", "bench", "tests"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(300)
def test_types_and_import_layers_hold():
    tool("mypy"), tool("lint-imports")
    r = subprocess.run([sys.executable, str(ROOT / ".ci" / "tree_checks.py")], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout and "0 broken" in r.stdout
