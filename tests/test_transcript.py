"""Transcripts on disk: appended and flushed as the chat goes, read back for --resume, with clear errors."""

from __future__ import annotations

import json

import pytest

from pocketspec.conversation import Conversation, assistant_record, chunk_record, header_record, user_record
from pocketspec.errors import UserError
from pocketspec.transcript import (
    TranscriptWriter, chats_dir, load_transcript, new_transcript_path, read_records, save_conversation)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_new_paths_live_under_home_chats_and_never_collide(home):
    first = new_transcript_path(now=0)
    assert first.parent == chats_dir() == home / "chats"
    TranscriptWriter(first).close()
    second = new_transcript_path(now=0)
    assert second != first and second.parent == first.parent


def test_every_record_is_on_disk_before_append_returns(tmp_path):
    path = tmp_path / "deep" / "chat.jsonl"
    writer = TranscriptWriter(path)
    writer.append(header_record(target="t", draft="ngram"))
    writer.append(user_record("hi"))
    writer.append(chunk_record("Hel"), sync=False)
    # Read through a separate handle while the writer is still open, as a resume after a kill would.
    records = read_records(path)
    assert [record["type"] for record in records] == ["header", "user", "chunk"]
    assert "at" in records[1] and "at" not in records[2]
    writer.close()


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(user_record("hi")) + "\n" + '{"type": "chunk", "te')
    assert read_records(path) == [user_record("hi")]
    assert load_transcript(path).unfinished_reply == ""


def test_resume_reads_back_what_was_written(tmp_path):
    path = tmp_path / "chat.jsonl"
    with TranscriptWriter(path) as writer:
        for record in (header_record(target="t", draft="d"), user_record("hi"), assistant_record("hello")):
            writer.append(record)
    with TranscriptWriter(path) as writer:  # a resumed chat appends to the same file
        writer.append(user_record("again"))
        writer.append(assistant_record("hello again"))
    replayed = load_transcript(path)
    assert [message.content for message in replayed.conversation.turns] == ["hi", "hello", "again", "hello again"]


def test_save_writes_a_resumable_file(tmp_path):
    conversation = Conversation("be brief")
    conversation.add_user("hi")
    conversation.add_assistant("hel", is_cut=True)
    path = tmp_path / "saved.jsonl"
    save_conversation(path, conversation, target="t", draft="ngram")
    replayed = load_transcript(path)
    assert replayed.conversation == conversation and replayed.header["draft"] == "ngram"
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("content, complaint", [
    (None, "does not exist"),
    ("", "is empty"),
    ('{"type": "user", "content": "hi"}\nnot json\n{"type": "reset"}\n', "line 2 is not JSON"),
    ('[1, 2]\n', "line 1 is not a JSON object"),
    ('{"type": "assistant", "content": "orphan"}\n', "record 1: a reply with no user message"),
    (b"\xff\xfe\n", "cannot read"),
])
def test_bad_transcripts_are_one_clear_user_error(tmp_path, content, complaint):
    path = tmp_path / "chat.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=complaint) as raised:
        load_transcript(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_an_unwritable_transcript_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot write the chat transcript"):
        TranscriptWriter(blocker / "chat.jsonl")
