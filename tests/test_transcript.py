"""Transcripts on disk: appended and flushed as the chat goes, read back for --resume, with clear errors."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from file_size_limit import run_with_file_size_limit
from pocketspec.conversation.conversation import (Conversation, assistant_record, chunk_record, header_record,
                                                  saved_header, user_record)
from pocketspec.errors import UserError
from pocketspec.conversation.transcript import (
    TranscriptWriter, chats_dir, check_appendable, check_not_in_use, find_transcript, load_transcript,
    new_transcript_path, read_records, save_conversation)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_new_chats_started_in_the_same_second_get_files_of_their_own(home):
    """Two chats name the same file (the second's stamp) before either creates it: each gets its own, the
    second a numbered one; a third, after both have closed, takes the next free number, never theirs."""
    proposed = new_transcript_path(now=0)
    assert proposed.parent == chats_dir() == home / "chats" and new_transcript_path(now=0) == proposed
    first, second = TranscriptWriter(proposed, is_new=True), TranscriptWriter(proposed, is_new=True)
    assert first.path == proposed and second.path == proposed.with_name(f"{proposed.stem}-2.jsonl")
    for writer, text in ((first, "one"), (second, "two")):
        writer.append(header_record(target="t", draft="ngram"))
        writer.append(user_record(text))
        writer.close()
    third = TranscriptWriter(proposed, is_new=True)
    assert third.path == proposed.with_name(f"{proposed.stem}-3.jsonl")
    third.close()
    assert not third.path.exists()  # closed before its first message
    assert [read_records(writer.path)[1]["content"] for writer in (first, second)] == ["one", "two"]


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


def _written(path, records) -> bytes:
    with TranscriptWriter(path) as writer:
        for record in records:
            writer.append(record, sync=record["type"] != "chunk")
    return path.read_bytes()


RECORDS = [header_record(target="t", draft="ngram"), user_record("héllo ✓"), chunk_record("Grüße, "),
           chunk_record("wörld 🐉"), assistant_record("Grüße, wörld 🐉"), user_record("and then?"),
           chunk_record("naïve")]


def test_every_cut_point_resumes_and_keeps_the_original(tmp_path):
    """A file cut at any byte (a crash or a full disk mid-write) resumes, and again after more turns."""
    whole = _written(tmp_path / "whole.jsonl", RECORDS)
    first_line_end = whole.index(b"\n") + 1
    for cut in range(first_line_end, len(whole)):  # every byte, inside multi-byte characters too
        path = tmp_path / f"cut-{cut}.jsonl"
        original = whole[:cut]
        path.write_bytes(original)
        num_whole_lines = original.count(b"\n")
        assert len(read_records(path)) in (num_whole_lines, num_whole_lines + 1)
        resumed = load_transcript(path).conversation
        with TranscriptWriter(path) as writer:
            if original.endswith(b"\n"):
                assert writer.set_aside is None and path.read_bytes() == original
            elif writer.set_aside is not None:  # a torn record: cut off, the original kept beside it
                assert writer.set_aside.read_bytes() == original
                assert path.read_bytes() == original[: original.rindex(b"\n") + 1]
            writer.append(user_record("after the crash"))
            writer.append(assistant_record("fine"))
        again = load_transcript(path).conversation
        assert again.turns[:-2] == resumed.turns
        assert [turn.content for turn in again.turns[-2:]] == ["after the crash", "fine"]
        with TranscriptWriter(path) as writer:  # and it resumes again, with nothing to cut this time
            assert writer.set_aside is None
            writer.append(user_record("once more"))
        assert load_transcript(path).conversation.turns[-2].content == "once more"


def test_a_whole_record_missing_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(header_record(target="t", draft="d")) + "\n" + json.dumps(user_record("hi")))
    with TranscriptWriter(path) as writer:
        assert writer.set_aside is None
        writer.append(assistant_record("hello"))
    assert [turn.content for turn in load_transcript(path).conversation.turns] == ["hi", "hello"]
    assert list(tmp_path.iterdir()) == [path]


def test_resume_finds_a_name_in_the_chats_folder(home, tmp_path, monkeypatch):
    saved = chats_dir() / "chat-20261123-101010.jsonl"
    _written(saved, RECORDS[:2])
    monkeypatch.chdir(tmp_path)
    assert find_transcript("chat-20261123-101010.jsonl") == saved
    assert find_transcript("chat-20261123-101010") == saved
    here = tmp_path / "chat-20261123-101010.jsonl"
    here.write_text("")
    assert find_transcript("chat-20261123-101010.jsonl") == here.relative_to(tmp_path)  # a path as given wins
    assert find_transcript(tmp_path / "absent.jsonl") == tmp_path / "absent.jsonl"


def test_save_never_replaces_a_file_unless_asked(tmp_path):
    conversation = Conversation()
    conversation.add_user("hi")
    conversation.add_assistant("hello")
    path = tmp_path / "notes.txt"
    path.write_text("precious")
    with pytest.raises(UserError, match="already exists; add --force"):
        save_conversation(path, conversation, header=header_record(target="t", draft="d"))
    assert path.read_text() == "precious"
    save_conversation(path, conversation, header=header_record(target="t", draft="d"), replace=True)
    assert load_transcript(path).conversation == conversation
    assert list(tmp_path.iterdir()) == [path]


def test_save_writes_a_resumable_file(tmp_path):
    conversation = Conversation("be brief")
    conversation.add_user("hi")
    conversation.add_assistant("hel", is_cut=True)
    path = tmp_path / "saved.jsonl"
    save_conversation(path, conversation, header=header_record(target="t", draft="ngram", backend="torch"))
    replayed = load_transcript(path)
    assert replayed.conversation == conversation and replayed.header["draft"] == "ngram"
    assert replayed.header["backend"] == "torch"
    assert not list(tmp_path.glob("*.partial"))


def test_a_saved_trimmed_chat_resumes_counting_every_reply_it_asked_for(tmp_path):
    """/save writes the kept turns only; its header names the replies before them (trimmed or /reset away), so
    the resumed chat's next reply gets a seed no earlier reply had (draws.reply_seed)."""
    conversation = Conversation()
    conversation.add_user("third")
    conversation.add_assistant("3")
    path = tmp_path / "saved.jsonl"
    header = saved_header(header_record(target="t", draft="d"), conversation, num_replies=5)
    save_conversation(path, conversation, header=header)
    with TranscriptWriter(path) as writer:  # the resumed chat appends its next turn
        writer.append(user_record("fourth"))
    replayed = load_transcript(path)
    assert replayed.num_replies == 6 and replayed.conversation.turns[0].content == "third"
    assert saved_header(header_record(target="t", draft="d"), conversation, num_replies=1) == header_record(
        target="t", draft="d")  # nothing before the saved turns: the header as a chat writes it


@pytest.mark.parametrize("content, complaint", [
    (None, "does not exist"),
    ("", "is empty"),
    ('{"type": "user", "content": "hi"}\nnot json\n{"type": "reset"}\n', "line 2 is not JSON"),
    ('[1, 2]\n', "line 1 is not a JSON object"),
    ("[" * 100_000 + "]" * 100_000 + '\n{"type": "reset"}\n', "line 1 is not JSON"),  # past Python's stack
    ('{"type": "assistant", "content": "orphan"}\n', "record 1: a reply with no user message"),
    (b"\xff\xfe\n", "cannot read"),
    ('{"type": "header", "version": 1, "target": 123, "draft": "ngram"}\n', "the header's 'target' must name"),
    ('{"type": "header", "version": 1, "target": "t", "draft": ["a"]}\n', "the header's 'draft' must name"),
    ('{"type": "header", "version": 1, "target": " ", "draft": "ngram"}\n', "the header's 'target' must name"),
    ('{"type": "header", "version": 1, "target": "t", "draft": "d", "earlier_replies": -1}\n',
     "the header's 'earlier_replies' must be a count"),
    ('{"type": "header", "version": 1, "target": "t", "draft": "d", "earlier_replies": true}\n',
     "the header's 'earlier_replies' must be a count"),
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


def test_a_transcript_the_disk_refuses_is_one_error_naming_it_and_a_new_one_is_left_out(tmp_path):
    """A full disk (here the file size limit, EFBIG, in a child process): the chat's first record failed as
    "cannot write the output" (stdout was fine), and the failed flush on closing left an empty transcript."""
    chats = tmp_path / "chats"
    result = run_with_file_size_limit(f"""
from pathlib import Path
from pocketspec.conversation.conversation import header_record, user_record
from pocketspec.conversation.transcript import TranscriptWriteFailed, TranscriptWriter
with TranscriptWriter(Path({str(chats / "chat.jsonl")!r}), is_new=True) as writer:
    try:
        writer.append(header_record(target="t", draft="d"))
        writer.append(user_record("hi"))
    except TranscriptWriteFailed as error:
        print(error)
""", 0)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith(f"cannot write the chat transcript {chats}/chat"), result.stdout
    assert "File too large" in result.stdout and list(chats.iterdir()) == []


def test_a_lone_surrogate_in_a_record_becomes_a_replacement_character(tmp_path):
    """JSON may escape one ("\\ud800"); no tokenizer can encode it, so it is read as U+FFFD."""
    path = tmp_path / "chat.jsonl"
    path.write_text('{"type": "user", "content": "a\\ud800b"}\n')
    assert load_transcript(path).conversation.turns[0].content == "a\ufffdb"


def test_a_transcript_open_in_one_chat_cannot_be_resumed_by_another(tmp_path):
    """Two chats appending to one file took each other's replies for dead ones and left it unresumable."""
    path = tmp_path / "chat.jsonl"
    with TranscriptWriter(path, is_new=True) as writer:
        writer.append(header_record(target="t", draft="ngram"))
        with pytest.raises(UserError, match="open in another chat"):
            check_not_in_use(path)
        with pytest.raises(UserError, match="open in another chat"):
            TranscriptWriter(path)
        writer.append(user_record("hi"))
    check_not_in_use(path)  # free again once the first chat ends
    with TranscriptWriter(path) as writer:
        writer.append(assistant_record("hello"))
    assert [message.content for message in load_transcript(path).conversation.turns] == ["hi", "hello"]


@pytest.mark.parametrize("records, is_kept", [
    ([header_record(target="t", draft="ngram")], False),
    ([header_record(target="t", draft="ngram"), {"type": "system", "content": "be brief"}], False),
    ([header_record(target="t", draft="ngram"), user_record("hi")], True),
])
def test_a_new_chat_without_a_message_leaves_no_file(tmp_path, records, is_kept):
    path = tmp_path / "chat.jsonl"
    with TranscriptWriter(path, is_new=True) as writer:
        for record in records:
            writer.append(record)
    assert path.exists() == is_kept


def test_a_transcript_that_cannot_be_appended_to_is_refused_before_a_model_loads(tmp_path, smollm2_path):
    """A read-only transcript (a read-only home): `chat --resume` loaded the model for seconds, then said it
    could not write there. Read-only here is chmod, and for root (whom chmod does not stop) chattr +i."""
    from test_cli_errors import assert_one_line_error, run_cli

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(header_record(target="smollm2-135m-instruct", draft="ngram")) + "\n"
                    + json.dumps(user_record("hi")) + "\n" + json.dumps(assistant_record("hello")) + "\n")
    path.chmod(0o444)
    is_immutable = os.access(path, os.W_OK) and subprocess.run(["chattr", "+i", str(path)]).returncode == 0
    try:
        if os.access(path, os.W_OK) and not is_immutable:
            pytest.skip("no way to make a file read-only for this user here")
        with pytest.raises(UserError, match="cannot write the chat transcript"):
            check_appendable(path)
        result = run_cli("chat", "--resume", str(path), "--threads", "1", stdin="And 2+2?")
        assert_one_line_error(result, f"cannot write the chat transcript {path}", "resume that")
    finally:
        if is_immutable:
            subprocess.run(["chattr", "-i", str(path)])
    check_appendable(tmp_path / "absent.jsonl")  # load_transcript's to say
