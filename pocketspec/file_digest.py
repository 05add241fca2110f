"""A file's sha256 (with a bar on stderr for a watcher) and the stamp that ties it to the file's size and mtime."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pocketspec.progress import progress_bar

CHUNK_BYTES = 8 * 1024 * 1024


def hash_file(path: Path, *, progress: bool) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file, progress_bar(progress, path.stat().st_size, f"verifying {path.name}") as update:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
            update(len(chunk))
    return digest.hexdigest()


def stamp_text(path: Path, sha256: str) -> str:
    """The stamp ties a verified hash to the file's size and mtime, so a replaced file is re-hashed."""
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"
