"""Write docs/reference/cli.md from the command line's own parser (`ggbatch.runner.cli.build_parser`).

The page is every subcommand's `--help`, so the reference cannot say what the parser does not.
tests/test_docs.py fails when the committed page differs from what this prints; regenerate with

    python docs/gen_cli_reference.py

The help is formatted at a fixed width with one style of option listing, so the page does not
depend on the terminal (COLUMNS) it is generated in.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "reference" / "cli.md"
WIDTH = 100
REGENERATE = "python docs/gen_cli_reference.py"

HEADER = f"""# Command reference

Every `ggbatch` command's `--help`, generated from the parser (`ggbatch.runner.cli.build_parser`)
by `docs/gen_cli_reference.py`; a test fails when this page and the parser differ. Regenerate it
with `{REGENERATE}` after changing a flag. What the settings do is in the user guide:
[Job files](../guide/job-files.md) (every flag of `run` is a job key) and
[Command line](../guide/command-line.md).
"""


class _Formatter(argparse.HelpFormatter):
    """One way of listing an option with a value (`-o, --output OUTPUT`), whatever Python's default."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(action.option_strings) + " " + value


def _fixed_width(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = functools.partial(_Formatter, width=WIDTH, max_help_position=32)
    if hasattr(parser, "color"):  # Python 3.14 colours help on a terminal
        parser.color = False


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(title: str, parser: argparse.ArgumentParser) -> str:
    _fixed_width(parser)
    return f"## {title}\n\n```text\n{parser.format_help().rstrip()}\n```\n"


def render() -> str:
    """The page, as the parser describes the commands today."""
    os.environ.setdefault("NO_COLOR", "1")
    from ggbatch.runner.cli import build_parser

    parser = build_parser()
    sections = [_section("ggbatch", parser)]
    sections += [_section(f"ggbatch {name}", sub) for name, sub in _subparsers(parser).items()]
    return HEADER + "\n" + "\n".join(sections)


def main() -> int:
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
