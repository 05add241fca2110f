"""A chat's history as the model sees it, trimmed to fit the context, and its transcript records.

Pure: no models and no files. A conversation is an optional system prompt plus turns that
alternate user, assistant, user, ... Trimming drops whole exchanges (a user message and
its reply), oldest first, and never the system prompt or the newest user message.

Transcript records are JSON objects, one per line, each with a "type":
  header     {"version", "target", "draft", "backend", "earlier_replies"} first line of a file (older ones
             have no backend; "earlier_replies", in a /save file: the replies asked for before its turns)
  system     {"content"}                               the system prompt was set ("" clears it)
  user       {"content"}
  chunk      {"text"}                                  reply text as it was shown, streamed
  assistant  {"content", "cut", "stop_reason", "stats"} the finished reply; supersedes its chunks
  reset      {}                                        /reset: the turns so far are forgotten
A reply whose process died leaves chunks with no assistant record; replaying the records
turns them into a reply marked cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

TRANSCRIPT_VERSION = 1
EARLIER_REPLIES = "earlier_replies"  # a header field (see saved_header)
RECORD_TYPES = ("header", "system", "user", "chunk", "assistant", "reset")


class TranscriptError(ValueError):
    """A record that cannot be replayed; the message says which and why."""


class PromptTooLong(ValueError):
    def __init__(self, num_tokens: int, max_tokens: int):
        super().__init__(f"the message needs {num_tokens} prompt tokens but at most {max_tokens} fit")
        self.num_tokens = num_tokens
        self.max_tokens = max_tokens


@dataclass
class Message:
    role: str  # user | assistant
    content: str
    is_cut: bool = False  # a reply stopped early: Ctrl-C, a full context, a killed process


@dataclass
class Conversation:
    system: str | None = None
    turns: list[Message] = field(default_factory=list)

    @property
    def is_awaiting_reply(self) -> bool:
        return bool(self.turns) and self.turns[-1].role == "user"

    def messages(self) -> list[dict[str, str]]:
        """The conversation in the form chat templates take."""
        return self._messages(self.turns)

    def _messages(self, turns: list[Message]) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": message.role, "content": message.content} for message in turns]

    def add_user(self, text: str) -> None:
        if self.is_awaiting_reply:
            raise ValueError("the previous user message has no reply yet")
        self.turns.append(Message("user", text))

    def add_assistant(self, text: str, *, is_cut: bool = False) -> None:
        if not self.is_awaiting_reply:
            raise ValueError("a reply needs a user message before it")
        self.turns.append(Message("assistant", text, is_cut))

    def drop_pending(self) -> None:
        """Forget a user message that will not be answered."""
        if self.is_awaiting_reply:
            self.turns.pop()

    def reset(self) -> None:
        self.turns.clear()

    def trim_to_fit(self, count_tokens: Callable[[list[dict[str, str]]], int], max_tokens: int) -> int:
        """Drop the oldest exchanges until count_tokens(messages) <= max_tokens; returns the turns dropped.

        Drops the fewest that fit, found by a galloping search (a conversation's tokens only fall as its oldest
        messages go): one count for a live chat that fits, two where it drops one exchange, and a few for a
        long resumed history rather than one per exchange. count_tokens may stop counting past max_tokens (any
        count above it means "does not fit"). Raises PromptTooLong, and drops nothing, when the system prompt
        and the newest user message alone do not fit.
        """
        num_droppable = len(self.turns) - (1 if self.is_awaiting_reply else 0)
        # whole exchanges (a user message and its reply), oldest first; the last step may drop a lone message
        drop_counts = [*range(0, num_droppable, 2), num_droppable]
        last = len(drop_counts) - 1

        def num_tokens(index: int) -> int:
            return count_tokens(self._messages(self.turns[drop_counts[index]:]))

        low, high, step = 0, 0, 1  # no index below low fits; the search ends at one that fits
        while (counted := num_tokens(high)) > max_tokens:
            if high == last:
                raise PromptTooLong(counted, max_tokens)
            low, high, step = high + 1, min(high + step, last), step * 2
        while low < high:
            middle = (low + high) // 2
            if num_tokens(middle) <= max_tokens:
                high = middle
            else:
                low = middle + 1
        num_dropped = drop_counts[high]
        self.turns = self.turns[num_dropped:]
        return num_dropped

    def to_records(self) -> list[dict]:
        """Records that replay to this conversation (for /save)."""
        records: list[dict] = [system_record(self.system)] if self.system else []
        for message in self.turns:
            if message.role == "user":
                records.append(user_record(message.content))
            else:
                records.append(assistant_record(message.content, is_cut=message.is_cut))
        return records


def header_record(*, target: str | None, draft: str | None, backend: str | None = None) -> dict:
    """backend: the one the chat ran on, which --resume runs on again (older transcripts have none)."""
    record = {"type": "header", "version": TRANSCRIPT_VERSION, "target": target, "draft": draft}
    return {**record, "backend": backend} if backend is not None else record


def saved_header(header: dict, conversation: Conversation, num_replies: int) -> dict:
    """The header of a /save file of `conversation`, whose chat asked for `num_replies` replies: it names those
    asked for before the saved turns (trimmed or /reset away), so that a chat resumed from the file counts
    its replies on from all of them and never samples a later reply with an earlier one's seed."""
    num_saved = sum(message.role == "user" for message in conversation.turns)
    num_earlier = max(0, num_replies - num_saved)
    return {**header, EARLIER_REPLIES: num_earlier} if num_earlier else header


def system_record(text: str | None) -> dict:
    return {"type": "system", "content": text or ""}


def user_record(text: str) -> dict:
    return {"type": "user", "content": text}


def chunk_record(text: str) -> dict:
    return {"type": "chunk", "text": text}


def assistant_record(text: str, *, is_cut: bool = False, stop_reason: str | None = None,
                     stats: dict | None = None) -> dict:
    record = {"type": "assistant", "content": text, "cut": is_cut}
    if stop_reason is not None:
        record["stop_reason"] = stop_reason
    if stats is not None:
        record["stats"] = stats
    return record


def reset_record() -> dict:
    return {"type": "reset"}


@dataclass
class Replayed:
    conversation: Conversation
    header: dict | None
    unfinished_reply: str | None  # text of a reply whose process died, now in the history as cut
    num_records: int
    num_replies: int  # replies asked for (user records and the header's earlier_replies), those before a /reset


def _text_field(record: dict, key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise TranscriptError(f"{where}: a {record['type']} record needs a text {key!r}")
    return value


def replay(records: list[dict]) -> Replayed:
    """Rebuild the conversation a transcript describes. Records are numbered from 1 in errors."""
    conversation = Conversation()
    header = None
    chunks: list[str] | None = None  # reply text streamed since the last user message

    def close_reply(text: str, is_cut: bool) -> None:
        nonlocal chunks
        if conversation.is_awaiting_reply:
            conversation.add_assistant(text, is_cut=is_cut)
        chunks = None

    for number, record in enumerate(records, start=1):
        where = f"record {number}"
        kind = record.get("type") if isinstance(record, dict) else None
        if kind not in RECORD_TYPES:
            raise TranscriptError(f"{where}: unknown record type {kind!r}")
        if kind == "header":
            if number != 1:
                raise TranscriptError(f"{where}: a header record must come first")
            if record.get("version") != TRANSCRIPT_VERSION:
                raise TranscriptError(f"{where}: transcript version {record.get('version')!r}, "
                                      f"this pocketspec reads version {TRANSCRIPT_VERSION}")
            for key in ("target", "draft"):
                value = record.get(key)
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    raise TranscriptError(f"{where}: the header's {key!r} must name a model, got {value!r}")
            earlier = record.get(EARLIER_REPLIES, 0)
            if type(earlier) is not int or earlier < 0:
                raise TranscriptError(f"{where}: the header's {EARLIER_REPLIES!r} must be a count, got {earlier!r}")
            header = record
        elif kind == "system":
            conversation.system = _text_field(record, "content", where) or None
        elif kind == "user":
            if conversation.is_awaiting_reply:  # the earlier reply died before showing anything
                close_reply("".join(chunks or []), True)
            conversation.add_user(_text_field(record, "content", where))
            chunks = []
        elif kind == "chunk":
            if chunks is None:
                raise TranscriptError(f"{where}: reply text with no user message before it")
            chunks.append(_text_field(record, "text", where))
        elif kind == "assistant":
            if not conversation.is_awaiting_reply:
                raise TranscriptError(f"{where}: a reply with no user message before it")
            close_reply(_text_field(record, "content", where), bool(record.get("cut", False)))
        else:
            conversation.reset()
            chunks = None
    unfinished = None
    if conversation.is_awaiting_reply:
        unfinished = "".join(chunks or [])
        close_reply(unfinished, True)
    num_replies = sum(record["type"] == "user" for record in records) + (header or {}).get(EARLIER_REPLIES, 0)
    return Replayed(conversation, header, unfinished, len(records), num_replies)
