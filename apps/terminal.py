"""Where a command's notes go: stderr, so that stdout carries only the output a script reads."""

from __future__ import annotations

import sys
from typing import Callable

import click


def note(text: str) -> None:
    click.echo(text, err=True)


def progress_line() -> Callable[[str], None] | None:
    """note() for someone watching a terminal; None for a script, whose stderr keeps only what it must read."""
    return note if sys.stderr.isatty() else None
