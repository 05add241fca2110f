"""Chat transcripts on disk: JSONL under POCKETSPEC_HOME/chats/, appended as the chat goes, read back for --resume.

Every record is written with one write() and flushed at once, so a killed process loses
nothing already shown; the end of each turn is also fsynced, so a finished turn survives
a power cut. The record types are described in pocketspec/conversation.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pocketspec.catalog import pocketspec_home, writable_home_folder
from pocketspec.conversation import Conversation, Replayed, TranscriptError, header_record, replay
from pocketspec.errors import UserError


def chats_dir() -> Path:
    return pocketspec_home() / "chats"


def new_transcript_path(now: float | None = None) -> Path:
    """A fresh file name, chats/chat-YYYYmmdd-HHMMSS.jsonl, with a suffix if that one is taken."""
    writable_home_folder(chats_dir(), "chat transcripts")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    path = chats_dir() / f"chat-{stamp}.jsonl"
    number = 2
    while path.exists():
        path = chats_dir() / f"chat-{stamp}-{number}.jsonl"
        number += 1
    return path


class TranscriptWriter:
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as error:
            raise UserError(f"cannot write the chat transcript {self.path}: {error.strerror or error}") from None

    def append(self, record: dict, *, sync: bool = True) -> None:
        """Add one record; `sync` also fsyncs (the end of a turn), else it is only flushed.

        Synced records carry a timestamp; streamed chunks, one per step, stay short.
        """
        if sync:
            record = {**record, "at": round(time.time(), 3)}
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "TranscriptWriter":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_records(path: Path) -> list[dict]:
    """The records of a transcript; a torn last line (the process died while writing it) is skipped."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"transcript {path} does not exist; chats are saved under {chats_dir()}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read transcript {path}: {error}") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: the write never finished
                break
            raise UserError(f"transcript {path} is corrupt: line {number} is not JSON") from None
        if not isinstance(record, dict):
            raise UserError(f"transcript {path} is corrupt: line {number} is not a JSON object")
        records.append(record)
    if not records:
        raise UserError(f"transcript {path} is empty")
    return records


def load_transcript(path: Path) -> Replayed:
    records = read_records(path)
    try:
        return replay(records)
    except TranscriptError as error:
        raise UserError(f"transcript {path} is corrupt: {error}") from None


def save_conversation(path: Path, conversation: Conversation, *, target: str | None, draft: str | None) -> None:
    """Write the conversation as a fresh transcript that --resume reads; replaces `path` atomically."""
    path = Path(path).expanduser()
    partial = path.with_name(path.name + ".partial")
    records = [header_record(target=target, draft=draft), *conversation.to_records()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "w", encoding="utf-8") as file:
            for record in records:
                file.write(json.dumps(record, ensure_ascii=False) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except OSError as error:
        raise UserError(f"cannot save the chat to {path}: {error.strerror or error}") from None
