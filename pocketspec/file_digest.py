"""A file's sha256 (with a bar on stderr for a watcher) and the stamp that ties it to the file's size and mtime."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from pocketspec.progress import progress_bar

CHUNK_BYTES = 8 * 1024 * 1024
STAMP_MAX_BYTES = 256  # a stamp is one short line: a longer file is not one


def hash_file(path: Path, *, progress: bool) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file, progress_bar(progress, path.stat().st_size, f"verifying {path.name}") as update:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
            update(len(chunk))
    return digest.hexdigest()


def stamp_text(path: Path, sha256: str) -> str:
    """The stamp ties a verified hash to the file's size and mtime, so a replaced file is re-hashed."""
    status = path.stat()
    return f"{sha256} {status.st_size} {status.st_mtime_ns}\n"


def stamped_sha256(path: Path, stamp: Path) -> str | None:
    """The sha256 that `stamp` (stamp_text) records for `path`, while it still matches the file's size and mtime;
    None for a stamp that is missing, stale or not a short UTF-8 text file (which the caller hashes again and
    replaces). A FIFO or a device is never read: that would wait, or read without end."""
    try:
        if not stat.S_ISREG(os.stat(stamp).st_mode):
            return None
        with open(stamp, "rb") as file:
            text = file.read(STAMP_MAX_BYTES + 1).decode("utf-8")
        known = text.split()[0]
        return known if text == stamp_text(path, known) else None
    except (OSError, UnicodeDecodeError, IndexError):
        return None
