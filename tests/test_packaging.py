"""The package as `pip install .` installs it: a wheel of the project, imported and run from the
repository's root, where a folder named like the package would shadow the installed one."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_installed_wheel_runs_from_the_repository_root(tmp_path):
    # Built from a copy: setuptools leaves its build/ folder beside the sources it builds.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                                 ".mypy_cache", ".ruff_cache", "site"))
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                            "-w", str(tmp_path / "wheel"), str(source)], capture_output=True, text=True, timeout=240)
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    (built,) = (tmp_path / "wheel").glob("ggbatch-*.whl")
    # Every package folder is in the wheel (pyproject.toml lists them one by one): an import from
    # the checkout's editable install would hide a missing one from the imports below.
    with zipfile.ZipFile(built) as whl:
        inside = set(whl.namelist())
    folders = [init.parent for root in ("runner", "workers") for init in (ROOT / root).rglob("__init__.py")]
    missing = [str(f.relative_to(ROOT)) for f in folders
               if f"ggbatch/{f.relative_to(ROOT).as_posix()}/__init__.py" not in inside]
    assert not missing, f"packages missing from the wheel (add them to pyproject.toml): {missing}"
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(built)], capture_output=True, text=True, timeout=120)
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    for cmd in (["-m", "ggbatch", "--version"],
                ["-c", "import ggbatch, ggbatch.runner.cli, ggbatch.workers.llama.engine; print(ggbatch.__file__)"]):
        done = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(target / "ggbatch" / "__init__.py")

    # Its type hints reach a user's type checker (PEP 561's py.typed): the names ggbatch loads on
    # first use have their own types, not Any, so a wrong use is found before it runs.
    assert "ggbatch/py.typed" in inside
    user = tmp_path / "user.py"
    user.write_text("import ggbatch\nreport: ggbatch.RunReport = ggbatch.run(model='m.gguf')\n"
                    "slots: int = ggbatch.Pool('m.gguf')\n")
    typed = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", sys.executable,
                            user.name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    errors = [line for line in typed.stdout.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("user.py:3: error: Incompatible types in assignment "
                                                     '(expression has type "Pool"'), typed.stdout
