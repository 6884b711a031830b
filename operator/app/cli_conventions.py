"""What every `specpilot` subcommand shares: help that shows defaults, one `--json`, progress.

Contract:
- `HelpFormatter` appends `(default: X)` to an option's help when X says something (not for
  None, a flag's False, or an empty list); `apply_conventions(parser)` gives it to a parser and
  every subparser below it, whichever module built them.
- `--json [PATH]` (`add_json_option`) means one thing on every command that has it: write the
  command's full result as JSON to PATH, or to standard output when PATH is `-` or left out
  (then nothing else goes to standard output). Without it a command prints its human summary.
  `write_json` does the writing; an unwritable PATH is a `ConfigError` naming `--json`.
- `check_seconds(flag, value)`, `check_count(flag, value)` and `check_port(flag, value)` refuse,
  as a `ConfigError` naming the flag, a number no run could use (NaN, infinity, a negative
  count, a port past 65535) before anything starts.
- `progress(label, total)` is a rich progress bar on standard error when standard error is a
  terminal, and a silent stand-in otherwise (pipes, CI logs and tests get no escape codes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from specpilot.tuner import ConfigError

STDOUT = "-"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with each option's meaningful default shown after its help text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = not (
            default is None
            or default is argparse.SUPPRESS
            or default is False
            or default == []
            or "%(default)" in text
            or not action.option_strings
        )
        return f"{text} (default: %(default)s)" if shown else text


def check_seconds(flag: str, value: float | None, *, zero: bool = False) -> None:
    """A duration: finite and above 0 (or at least 0 with `zero`); None is unset."""
    if value is None:
        return
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        floor = "0 or more" if zero else "above 0"
        raise ConfigError(flag, value, f"a finite number of seconds {floor}")


def check_count(flag: str, value: int) -> None:
    if value < 0:
        raise ConfigError(flag, value, "an integer of 0 or more")


def check_port(flag: str, value: int) -> None:
    if not 1 <= value <= 65535:
        raise ConfigError(flag, value, "a TCP port in 1..65535")


def apply_conventions(parser: argparse.ArgumentParser) -> None:
    """`HelpFormatter` on `parser` and on every subcommand parser below it."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                apply_conventions(child)


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        metavar="PATH",
        help=f"write {what} as JSON to PATH ('-' or no PATH: standard output) instead of "
        "the human summary",
    )


def write_json(destination: str, report: Any, *, indent: int = 2) -> None:
    """`report` as JSON to `destination` (a path, or `-` for standard output)."""
    text = json.dumps(report, indent=indent) + "\n"
    if destination == STDOUT:
        sys.stdout.write(text)
        return
    try:
        Path(destination).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--json", destination, "a writable file path or -", str(exc)) from None


class Progress(Protocol):
    def advance(self, steps: int = 1) -> None: ...


class _Silent:
    def advance(self, steps: int = 1) -> None:
        pass


class _Rich:
    def __init__(self, bar: Any, task: Any) -> None:
        self._bar, self._task = bar, task

    def advance(self, steps: int = 1) -> None:
        self._bar.advance(self._task, steps)


@contextmanager
def progress(label: str, total: int | None) -> Iterator[Progress]:
    """A progress bar over `total` steps (None: a spinner with the elapsed time)."""
    if not sys.stderr.isatty():
        yield _Silent()
        return
    from rich.console import Console
    from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), TextColumn("{task.completed}/{task.total}")]
    with RichProgress(
        *columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True
    ) as bar:
        yield _Rich(bar, bar.add_task(label, total=total))
