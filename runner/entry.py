"""The `ggbatch` command's first lines. SIGINT and SIGTERM are taken here, before the command line
is read and before the coordinator's modules load (a fraction of a second): a stop in the run's
first moments then ends it as a later one does (runner/pool/signals.py). Only the standard library
loads before that."""

from __future__ import annotations


def main() -> None:
    from .closed_pipe import standard_streams_open, standard_streams_write_anything

    standard_streams_open()  # before any module opens a file that would take a closed descriptor's number
    standard_streams_write_anything()
    from .pool.signals import STOP

    STOP.install()
    from .cli import entry_point

    entry_point()
