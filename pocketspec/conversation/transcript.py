"""Chat transcripts on disk: JSONL under POCKETSPEC_HOME/chats/, appended as the chat goes, read back for --resume.

Every record is written with one write() and flushed at once, so a killed process loses
nothing already shown; the end of each turn is also fsynced, so a finished turn survives
a power cut. The record types are described in pocketspec/conversation/conversation.py.

A file whose last line was cut mid-write (a crash, a full disk) is never appended to as
it is: the writer first copies it aside, then truncates it to its last whole line, so
the next record starts a line of its own and the file resumes again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from pathlib import Path

from pocketspec.atomic_file import is_device_or_pipe, replaced_on_success
from pocketspec.models.catalog import pocketspec_home, writable_home_folder
from pocketspec.conversation.conversation import Conversation, Replayed, TranscriptError, replay
from pocketspec.errors import UserError


def chats_dir() -> Path:
    return pocketspec_home() / "chats"


def new_transcript_path(now: float | None = None) -> Path:
    """A new chat's file name, chats/chat-YYYYmmdd-HHMMSS.jsonl; TranscriptWriter(is_new=True) creates it, or
    the first of chat-...-2.jsonl, -3, ... that no other chat has taken meanwhile."""
    writable_home_folder(chats_dir(), "chat transcripts")
    return chats_dir() / f"chat-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}.jsonl"


def _create_new(path: Path):
    """`path` created for appending, or the first numbered name beside it that does not exist yet (each tried
    with O_EXCL, so two chats started in the same second never share a file): (path, file)."""
    candidate, number = path, 2
    while True:
        try:
            return candidate, open(candidate, "x", encoding="utf-8")
        except FileExistsError:
            candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
            number += 1


def _torn_tail_bytes(path: Path) -> int:
    """How many bytes follow the last newline of `path` (0 for a missing or empty file)."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            position = size
            while position > 0:
                step = min(position, 64 * 1024)
                file.seek(position - step)
                block = file.read(step)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    return size - (position - step + newline + 1)
                position -= step
            return size
    except FileNotFoundError:
        return 0


def _is_whole_record(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data.decode("utf-8")), dict)
    except (UnicodeDecodeError, ValueError, RecursionError):  # ValueError: JSONDecodeError, a number too long
        return False


def set_aside_torn_tail(path: Path) -> Path | None:
    """End `path` at a line boundary; returns the copy of the original kept beside it, or None if nothing was cut.

    A tail without a newline is what a write that never finished leaves; a record
    appended after it would share its line and make the file unreadable. A whole record
    that lacks only its newline gets one; anything else is cut off.
    """
    path = Path(path)
    num_torn = _torn_tail_bytes(path)
    if not num_torn:
        return None
    with open(path, "r+b") as file:
        file.seek(-num_torn, os.SEEK_END)
        if _is_whole_record(file.read()):
            file.write(b"\n")
            file.flush()
            os.fsync(file.fileno())
            return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    copy = path.with_name(f"{path.name}.torn-{stamp}")
    number = 2
    while copy.exists():
        copy = path.with_name(f"{path.name}.torn-{stamp}-{number}")
        number += 1
    shutil.copy2(path, copy)
    with open(path, "r+b") as file:
        file.truncate(file.seek(0, os.SEEK_END) - num_torn)
        file.flush()
        os.fsync(file.fileno())
    return copy


def find_transcript(name: str | Path) -> Path:
    """What --resume NAME means: the path as given, else NAME (or NAME.jsonl) in the chats folder."""
    path = Path(name).expanduser()
    if path.exists():
        return path
    for candidate in (chats_dir() / path, chats_dir() / f"{path}.jsonl"):
        if not path.is_absolute() and candidate.is_file():
            return candidate
    return path


class TranscriptWriteFailed(UserError):
    """The chat's transcript could not be written (a full disk): the chat ends, as a chat that cannot keep its
    turns should, where another UserError (a message too long) only refuses one message."""


class TranscriptWriter:
    """Appends records to a transcript; `set_aside` is the copy kept when a torn last line was cut off.

    is_new: a new chat's file, created under `path` or a numbered name beside it (self.path says which), and
    removed when it is closed without a user message (a chat refused or stopped before its first message
    leaves nothing behind in the chats folder, a --system prompt or not). The file is locked while it is
    open: a second chat cannot resume or /save over it meanwhile (check_not_in_use)."""

    def __init__(self, path: Path, *, is_new: bool = False):
        self.path = Path(path)
        self._is_new = is_new
        self._has_message = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if is_new:
                self.path, self._file = _create_new(self.path)
            else:
                self._file = open(self.path, "a", encoding="utf-8")
        except OSError as error:
            raise UserError(f"cannot write the chat transcript {self.path}: {error.strerror or error}") from None
        try:
            _lock(self._file.fileno(), self.path)
            self.set_aside = set_aside_torn_tail(self.path)
        except OSError as error:
            self._file.close()
            raise UserError(f"cannot write the chat transcript {self.path}: {error.strerror or error}") from None
        except UserError:
            self._file.close()
            raise

    def append(self, record: dict, *, sync: bool = True) -> None:
        """Add one record; `sync` also fsyncs (the end of a turn), else it is only flushed.

        Synced records carry a timestamp; streamed chunks, one per step, stay short.
        """
        if sync:
            record = {**record, "at": round(time.time(), 3)}
        try:
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._file.flush()
            self._has_message = self._has_message or record.get("type") == "user"  # in the file: closing keeps it
            if sync:
                os.fsync(self._file.fileno())
        except OSError as error:
            raise TranscriptWriteFailed(f"cannot write the chat transcript {self.path}: "
                                        f"{error.strerror or error}") from None

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self._file.close()  # closed even where the last flush fails, which append has already said
        except OSError:
            pass
        if self._is_new and not self._has_message:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def __enter__(self) -> "TranscriptWriter":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_records(path: Path) -> list[dict]:
    """The records of a transcript; a torn last line (the process died while writing it) is skipped."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"transcript {path} does not exist; chats are saved under {chats_dir()}") from None
    except OSError as error:
        raise UserError(f"cannot read transcript {path}: {error.strerror or error}") from None
    lines = data.split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_last = number == len(lines)  # no newline after it: the write may never have finished
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            if is_last:
                break
            raise UserError(f"cannot read transcript {path}: line {number} is not UTF-8 ({error.reason})") from None
        except (ValueError, RecursionError):  # JSONDecodeError, a number too long; nested past Python's stack
            if is_last:
                break
            raise UserError(f"transcript {path} is corrupt: line {number} is not JSON") from None
        if not isinstance(record, dict):
            raise UserError(f"transcript {path} is corrupt: line {number} is not a JSON object")
        records.append(_without_lone_surrogates(record))
    if not records:
        raise UserError(f"transcript {path} is empty")
    return records


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(record: dict) -> dict:
    """A record whose JSON escapes a lone surrogate ("\\ud800", which no tokenizer or file can encode) with
    U+FFFD in its place, as text_input replaces a stray byte."""
    text = json.dumps(record, ensure_ascii=False)  # a pair is one character by now: a surrogate left is alone
    return json.loads(_LONE_SURROGATE.sub("\ufffd", text)) if _LONE_SURROGATE.search(text) else record


def check_not_in_use(path: Path, advice: str = "resume it once that chat ends") -> None:
    """UserError when another chat holds the transcript (TranscriptWriter locks it): two chats appending to
    one file would each take the other's reply for a dead one, and leave a file that no longer resumes."""
    if Path(path).exists() and not Path(path).is_file():  # opening a FIFO would wait for a writer for good
        raise UserError(f"transcript {path} is not a regular file: give a transcript a chat saved")
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return  # missing or unreadable: load_transcript says so
    try:
        _lock(descriptor, path, advice)
    finally:
        os.close(descriptor)  # the lock goes with it


def check_appendable(path: Path) -> None:
    """UserError, said before a model loads, when a resumed chat could not append its turns to `path` (a
    read-only home); a missing or unreadable file is load_transcript's to say."""
    if not Path(path).is_file():
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as error:
        raise UserError(f"cannot write the chat transcript {path}: {error.strerror or error}; a resumed chat "
                        "appends its turns there (copy it somewhere writable and resume that)") from None


def _lock(descriptor: int, path: Path, advice: str = "resume it once that chat ends") -> None:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(f"transcript {path} is open in another chat; {advice}") from None
    except OSError:
        pass  # a filesystem without locks: chat as before


def load_transcript(path: Path) -> Replayed:
    records = read_records(path)
    try:
        return replay(records)
    except TranscriptError as error:
        raise UserError(f"transcript {path} is corrupt: {error}") from None


def save_conversation(path: Path, conversation: Conversation, *, header: dict, replace: bool = False) -> None:
    """Write the conversation, after `header` (header_record), as a fresh transcript that --resume reads.

    An existing file is a UserError unless `replace`; then it is replaced atomically, unless another chat
    has it open (it would go on appending to the old one). A folder is refused; a device or a pipe
    (`/dev/stdout`) is written through, as `generate --output` writes it.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{path} is a folder: give a file name")
    if path.exists() and not is_device_or_pipe(path):
        if not replace:
            raise UserError(f"{path} already exists; add --force to replace it")
        check_not_in_use(path, advice="save to another file")
    records = [header, *conversation.to_records()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot write the chat transcript {path}: {error.strerror or error}") from None
    with replaced_on_success(path, what="the chat transcript") as file:
        for record in records:
            file.write(json.dumps(record, ensure_ascii=False) + "\n")
