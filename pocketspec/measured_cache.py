"""What this machine was measured to do, cached in POCKETSPEC_HOME: one JSON file a key, measured alone.

Cost tables (pocketspec/calibrate.py) live in costs/ and exact verify widths
(pocketspec/backends/exact_width.py) in exact_widths/. Each is written whole under a unique
temporary name and renamed into place, so two processes writing at once never tear a file. A
measurement takes the home's measuring lock first: a second process that needs the same table
waits and then reads it instead of measuring it again, and no process times forward passes while
another one loads the CPU with its own measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import click

from pocketspec.models.catalog import pocketspec_home


def costs_dir() -> Path:
    return pocketspec_home() / "costs"


def exact_widths_dir() -> Path:
    return pocketspec_home() / "exact_widths"


def read_json(path: Path):
    """The file's JSON, or None when it is missing or unreadable (the caller then measures again); a FIFO or a
    device is not one of these files, and is not read (that would wait)."""
    try:
        if not Path(path).is_file():
            return None
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, data) -> bool:
    """Writes `data` whole or not at all; False when the home cannot be written (the next run measures again)."""
    path = Path(path)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(data, file, indent=1)
        os.replace(temporary, path)
        return True
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return False


_held = threading.local()  # how deep this thread is inside measuring_alone: the lock is taken once


@contextlib.contextmanager
def measuring_alone() -> Iterator[None]:
    """Holds the home's measuring lock (an flock on costs/measuring.lock) while the block runs; inside
    a block that holds it already (measuring several tables in a row), it is not taken again.

    Without a writable home, or without flock (Windows), the block runs unlocked."""
    depth = getattr(_held, "depth", 0)
    if depth:
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    try:
        import fcntl

        costs_dir().mkdir(parents=True, exist_ok=True)
        lock_file = open(costs_dir() / "measuring.lock", "a")
    except (ImportError, OSError):
        yield
        return
    with lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process measures or exports: a watcher is told why nothing moves
            if sys.stderr.isatty():
                click.echo(f"waiting for another measurement or ONNX export in {costs_dir().parent} to end (it "
                           f"holds {lock_file.name})", err=True)
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
