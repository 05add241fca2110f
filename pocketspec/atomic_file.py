"""Files the user names as outputs: written whole or not at all, never onto an input.

A file is written to a hidden temporary name beside its final one, fsynced, and renamed
over the final name only once it is complete, so an interrupted run leaves the old file
(or none) under the final name and never a half-written one. A device or a pipe
(/dev/null, /dev/stdout, a FIFO, a shell's >(...)) has nothing to replace, and renaming a
file over it would replace the device itself: it is written as the text comes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
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


def check_output_folder(path: Path, *, what: str) -> None:
    """UserError when `path` could never be written because its folder is missing (or is a file): said before a
    model loads for a minute, not after."""
    path = Path(path).expanduser()
    number = named_descriptor(path)
    if number is not None and own_descriptor(path) is None:
        # refused now: by the time the output is written, a file of this process's own (a model, a log) may hold
        # that number, and the text would go into it
        raise UserError(f"cannot write {what} {path}: descriptor {number} is not open "
                        f"(open it with the shell, as in {number}>out.txt, or name a file)")
    if is_device_or_pipe(path):
        return
    folder = Path(os.path.realpath(path)).parent
    if not folder.is_dir():
        raise UserError(f"cannot write {what} {path}: the folder {folder} does not exist")


@contextlib.contextmanager
def replaced_on_success(path: Path, *, what: str) -> Iterator[IO[str]]:
    """Yields a text file that becomes `path` when the block ends without an exception (or, where the block
    asked for it with keep_beside, a new file beside `path`, which is left as it was).

    `what` names the file in errors ("--output", "the chat transcript").

    On an exception (Ctrl-C included) the temporary file is removed and `path` is left as it was. A
    symbolic link is followed, as the shell's `>` follows it: the file it names is replaced, not the link.
    """
    path = Path(path).expanduser()
    if is_device_or_pipe(path):
        with _written_through(path, what) as file:
            yield file
        return
    final = Path(os.path.realpath(path))
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
    except OSError as error:
        raise _cannot_write(what, path, error) from None
    file = os.fdopen(descriptor, "w", encoding="utf-8")
    is_done = False
    try:
        checked = _CheckedWrites(file, what, path)
        yield checked
        try:
            file.flush()
            os.fsync(file.fileno())
            file.close()
            _keep_mode(final, temporary)
            if checked.beside_tag is None:
                os.replace(temporary, final)
            else:
                checked.kept_as = _link_beside(temporary, final, checked.beside_tag)
        except OSError as error:
            raise _cannot_write(what, path, error) from None
        is_done = True
    finally:
        if not is_done:
            with contextlib.suppress(OSError):  # a full disk fails the buffer's last flush again: keep the first error
                file.close()
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


def _cannot_write(what: str, path: Path, error: OSError) -> UserError:
    return UserError(f"cannot write {what} {path}: {error.strerror or error}")


def _link_beside(temporary: str, final: Path, tag: str) -> Path:
    """The finished temporary file under the first free name of `out.TAG.jsonl`, `out.TAG-2.jsonl`, ... beside
    `final`, claimed with a hard link: unlike a rename, it never replaces a file that took the name meanwhile."""
    for number in range(1, 10_000):
        name = final.with_name(f"{final.stem}.{tag}{'' if number == 1 else f'-{number}'}{final.suffix}")
        try:
            os.link(temporary, name)
        except FileExistsError:
            continue
        os.unlink(temporary)
        return name
    raise OSError(errno.EEXIST, f"every name for its .{tag} files is taken")


# names of this process's own open descriptors; /dev/fd/N and /proc/self/fd/N name the others
_STANDARD_DESCRIPTORS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_DESCRIPTOR_FOLDERS = ("/dev/fd/", "/proc/self/fd/")


def named_descriptor(path: Path) -> int | None:
    """The descriptor number that `path` names as given (/dev/stdout: 1, /dev/fd/3: 3), open or not, else None."""
    text = os.path.normpath(str(path))
    number = _STANDARD_DESCRIPTORS.get(text)
    for folder in _DESCRIPTOR_FOLDERS:
        if text.startswith(folder) and text[len(folder):].isdigit():
            number = int(text[len(folder):])
    return number


def own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that `path` names as given (/dev/stdout, /dev/fd/3), else None. Such a
    path is where the shell's redirection points, maybe a regular file (`> out.txt`) that holds text written
    before: it is written through the descriptor at its offset, never reopened (which would empty the file) nor
    replaced (which would cut it from the shell's later writes)."""
    number = named_descriptor(path)
    if number is None:
        return None
    try:
        os.fstat(number)
    except OSError:  # not open in this process: the path is only a name, and opening it fails as it would
        return None
    return number


def is_device_or_pipe(path: Path) -> bool:
    """A character or block device, a FIFO, a socket or one of this process's descriptors (own_descriptor):
    written through as it is, never replaced."""
    if own_descriptor(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:  # nothing there yet (or unreachable: the temporary file's creation says why)
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextlib.contextmanager
def _written_through(path: Path, what: str) -> Iterator[IO[str]]:
    """`path` opened as it is, for a device or a pipe (one of this process's descriptors: a copy of it, after
    what Python's own streams hold); a failed open or last write is one UserError."""
    descriptor = own_descriptor(path)
    try:
        if descriptor is not None:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            file = os.fdopen(os.dup(descriptor), "w", encoding="utf-8")
        else:
            file = open(path, "w", encoding="utf-8")
    except OSError as error:
        raise _cannot_write(what, path, error) from None
    try:
        yield _CheckedWrites(file, what, path)
    except BaseException:
        with contextlib.suppress(OSError):
            file.close()
        raise
    try:
        file.close()
    except OSError as error:  # /dev/full, a pipe whose reader left
        raise _cannot_write(what, path, error) from None


class _CheckedWrites:
    """An output's text stream whose failed write or flush (a full disk, /dev/full, a pipe's reader gone) is one
    UserError naming the output, not a traceback from wherever the text was written."""

    def __init__(self, file: IO[str], what: str, path: Path):
        self._file, self._what, self._path = file, what, path
        self.beside_tag: str | None = None  # keep_beside's tag
        self.kept_as: Path | None = None  # where keep_beside's file went, once written

    def keep_beside(self, tag: str) -> None:
        """Once whole, the file goes beside the one named (out.jsonl: out.TAG.jsonl, or out.TAG-2.jsonl where that
        is taken), which is left as it was (a link: beside the file it names)."""
        self.beside_tag = tag

    def _failed(self, error: OSError) -> UserError:
        return _cannot_write(self._what, self._path, error)

    def write(self, text: str) -> int:
        try:
            return self._file.write(text)
        except OSError as error:
            raise self._failed(error) from None

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as error:
            raise self._failed(error) from None

    def __getattr__(self, name: str):
        return getattr(self._file, name)
