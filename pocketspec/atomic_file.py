"""Files the user names as outputs: written whole or not at all, never onto an input.

A file is written to a hidden temporary name beside its final one, fsynced, and renamed
over the final name only once it is complete, so an interrupted run leaves the old file
(or none) under the final name and never a half-written one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from pocketspec.errors import UserError


def is_same_file(first: Path, second: Path) -> bool:
    """True when both paths name one file on disk, through symlinks and hard links too."""
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist (or cannot be reached): not the same file
        return False


def refuse_output_onto_inputs(output: Path, inputs: Iterable[tuple[str, Path | None]], *, flag: str) -> None:
    """UserError when `output` is one of `inputs` (pairs of the flag that named it and its path)."""
    for input_flag, path in inputs:
        if path is not None and is_same_file(output, path):
            raise UserError(f"{flag} {output} is the {input_flag} file: writing it would destroy the input; "
                            "choose another output path")


@contextlib.contextmanager
def replaced_on_success(path: Path, *, what: str) -> Iterator[IO[str]]:
    """Yields a text file that becomes `path` when the block ends without an exception.

    `what` names the file in errors ("--output", "the chat transcript").

    On an exception (Ctrl-C included) the temporary file is removed and `path` is left as it was.
    """
    path = Path(path).expanduser()
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    except OSError as error:
        raise UserError(f"cannot write {what} {path}: {error.strerror or error}") from None
    is_done = False
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            yield file
            try:
                file.flush()
                os.fsync(file.fileno())
                _keep_mode(path, temporary)
                os.replace(temporary, path)
            except OSError as error:
                raise UserError(f"cannot write {what} {path}: {error.strerror or error}") from None
        is_done = True
    finally:
        if not is_done:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _keep_mode(path: Path, temporary: str) -> None:
    """A replaced file keeps its permissions; a new one gets the usual ones (mkstemp makes it 0600)."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(temporary, mode)
