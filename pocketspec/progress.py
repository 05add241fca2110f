"""Progress drawn on stderr for someone watching a terminal: a bar when the amount of work is known,
the seconds spent so far when it is not (a step that reports nothing until it ends)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

import click

TICK_SECONDS = 1.0


@contextlib.contextmanager
def progress_bar(enabled: bool, length: int, label: str) -> Iterator[Callable[[int], None]]:
    """Yields update(amount done since the last call); draws a bar on stderr when enabled."""
    if not enabled:
        yield lambda _: None
        return
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


@contextlib.contextmanager
def elapsed_seconds(enabled: bool, label: str) -> Iterator[None]:
    """While the block runs, `label` and the whole seconds spent so far, redrawn in place on stderr each
    second when enabled; at the end, the total."""
    if not enabled:
        yield
        return
    started = time.monotonic()
    done = threading.Event()

    def draw(end: str = "") -> None:
        sys.stderr.write(f"\r{label} {int(time.monotonic() - started)} s{end}")
        sys.stderr.flush()

    def redraw() -> None:
        while not done.wait(TICK_SECONDS):
            draw()

    draw()
    ticker = threading.Thread(target=redraw, name="elapsed-seconds", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        draw("\n")
