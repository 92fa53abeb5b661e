"""The `ggbatch` command's first lines. SIGINT and SIGTERM are taken here, before the command line
is read and before the coordinator's modules load (a fraction of a second): a stop in the run's
first moments then ends it as a later one does (runner/pool/signals.py). Only the standard library
loads before that."""

from __future__ import annotations

import os
import sys

GONE_FOLDER = ("ggbatch: error: the current folder no longer exists (it was removed or moved away): cd to a "
               "folder that exists and run again")


def main() -> None:
    from .closed_pipe import standard_streams_open, standard_streams_write_anything

    standard_streams_open()  # before any module opens a file that would take a closed descriptor's number
    standard_streams_write_anything()
    current_folder_exists()
    from .pool.signals import STOP

    STOP.install()
    from .child_processes import CHILD_ENVIRONMENT

    for name, value in CHILD_ENVIRONMENT.items():  # the command's process is its own, unlike a caller's of the API
        os.environ.setdefault(name, value)  # before llama.cpp (a JSON schema's grammar, --version) loads numpy here
    from .cli import entry_point

    entry_point()


def current_folder_exists() -> None:
    """Exit 2 with one line when the current folder was removed (a deleted release folder): every
    relative path would fail, and the workers' spawn asks for the folder (os.getcwd), a traceback."""
    try:
        os.getcwd()
    except FileNotFoundError:
        print(GONE_FOLDER, file=sys.stderr)
        sys.exit(2)
