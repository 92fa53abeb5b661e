"""mypy and import-linter over the ggbatch package, by its import names; mypy over the benchmark
scripts too (bench/), which call the package's insides: a changed signature breaks them here, not
on a lent GPU's few minutes.

Neither follows setuptools' import-hook editable install nor pyproject's package-dir mapping
(ggbatch -> package/, ggbatch.runner -> runner/, ggbatch.workers -> workers/), so this lays the
package out under its import names as a tree of symbolic links in a temporary folder and runs both
there (settings from pyproject.toml, third-party packages from this interpreter's environment),
printing mypy's findings with the repository's own paths.

    python .ci/tree_checks.py        (exit status: 0 when both pass)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# import name's folder -> the repository's folder (pyproject.toml [tool.setuptools.package-dir])
FOLDERS = {"ggbatch/runner": "runner", "ggbatch/workers": "workers"}


def link_tree(where: Path) -> None:
    """ggbatch/ with package/'s modules, and runner/ and workers/ linked in as its subpackages."""
    (where / "ggbatch").mkdir()
    for module in (ROOT / "package").glob("*.py"):
        (where / "ggbatch" / module.name).symlink_to(module)
    for name, folder in FOLDERS.items():
        (where / name).symlink_to(ROOT / folder, target_is_directory=True)


def repository_paths(line: str) -> str:
    for name, folder in FOLDERS.items():
        if line.startswith(name + "/"):
            return folder + line[len(name):]
    return "package" + line[len("ggbatch"):] if line.startswith("ggbatch/") else line


def run(command: list[str], where: str, mypy_path: str = "") -> int:
    # PYTHONPATH: the tree's ggbatch comes before the installed one (the editable install's hook)
    r = subprocess.run(command, cwd=where, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": where, "MYPYPATH": mypy_path})
    sys.stdout.write("".join(repository_paths(line) + "\n" for line in r.stdout.splitlines()))
    sys.stderr.write(r.stderr)
    return r.returncode


def main() -> int:
    config = str(ROOT / "pyproject.toml")
    with tempfile.TemporaryDirectory(prefix="ggbatch-checks-") as where:
        link_tree(Path(where))
        mypy = [sys.executable, "-m", "mypy", "--config-file", config, "--cache-dir", str(ROOT / ".mypy_cache"),
                "--python-executable", sys.executable]
        typed = run([*mypy, "-p", "ggbatch"], where)
        # The scripts import each other and the tests' helpers (the fake engine) as top-level
        # modules; those helpers are followed for their types, not checked themselves.
        benches = run([*mypy, "--follow-imports=silent", *map(str, sorted((ROOT / "bench").glob("*.py")))], where,
                      mypy_path=os.pathsep.join([str(ROOT / "bench"), str(ROOT / "tests")]))
        layered = run([str(Path(sys.executable).parent / "lint-imports"), config, "--no-cache"], where)
    return typed or benches or layered


if __name__ == "__main__":
    sys.exit(main())
