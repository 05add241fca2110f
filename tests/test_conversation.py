"""The pure conversation: roles, trimming oldest exchanges to a token limit, replaying transcript records."""

from __future__ import annotations

import pytest

from pocketspec.conversation.conversation import (
    Conversation, PromptTooLong, TranscriptError, assistant_record, chunk_record, header_record, replay,
    reset_record, system_record, user_record)


def count_words(messages: list[dict[str, str]]) -> int:
    """A stand-in tokenizer: one token per word, plus two per message for the template."""
    return sum(len(message["content"].split()) + 2 for message in messages)


def chat_of(num_exchanges: int, system: str | None = "be brief") -> Conversation:
    conversation = Conversation(system)
    for number in range(num_exchanges):
        conversation.add_user(f"question {number} " + "word " * 5)
        conversation.add_assistant(f"answer {number} " + "word " * 5)
    return conversation


def test_messages_put_the_system_prompt_first_and_alternate():
    conversation = chat_of(2)
    assert [message["role"] for message in conversation.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert Conversation().messages() == []


def test_roles_must_alternate():
    conversation = Conversation()
    with pytest.raises(ValueError):
        conversation.add_assistant("a reply to nothing")
    conversation.add_user("hi")
    with pytest.raises(ValueError):
        conversation.add_user("hi again")
    conversation.drop_pending()
    assert conversation.turns == []


def test_trim_drops_oldest_exchanges_and_keeps_system_and_newest_message():
    conversation = chat_of(4)
    conversation.add_user("newest question")
    total = count_words(conversation.messages())  # 4 exchanges of 2 × 9 tokens, system 4, newest 4
    num_dropped = conversation.trim_to_fit(count_words, total - 1)
    assert num_dropped == 2
    assert conversation.turns[0].content.startswith("question 1")
    num_dropped = conversation.trim_to_fit(count_words, 4 + 4 + 18)
    assert num_dropped == 4
    assert conversation.system == "be brief"
    assert [message.content for message in conversation.turns][-1] == "newest question"
    assert conversation.turns[0].content.startswith("question 3")


def _trimmed_one_exchange_at_a_time(conversation: Conversation, max_tokens: int) -> int | None:
    """What trimming drops by its definition: the oldest exchange, again and again (None: nothing fits)."""
    kept = list(conversation.turns)
    num_fixed = 1 if conversation.is_awaiting_reply else 0
    while count_words(Conversation(conversation.system, kept).messages()) > max_tokens:
        if len(kept) <= num_fixed:
            return None
        del kept[: min(2, len(kept) - num_fixed)]
    return len(conversation.turns) - len(kept)


@pytest.mark.parametrize("num_exchanges", [0, 1, 2, 5, 33, 200])
@pytest.mark.parametrize("is_awaiting_reply", [True, False])
def test_trim_drops_what_dropping_one_exchange_at_a_time_drops_with_few_counts(num_exchanges, is_awaiting_reply):
    """Trimming searches for the fewest exchanges to drop (a resumed chat of 1000 exchanges took 196 s on
    SmolLM2's tokenizer, one count per exchange): the same turns go, whatever the limit, in a few counts."""
    num_words = count_words(chat_of(num_exchanges).messages())
    for max_tokens in range(0, num_words + 30, max(7, num_words // 40)):
        conversation = chat_of(num_exchanges)
        if is_awaiting_reply:
            conversation.add_user("newest " * (max_tokens % 5))
        expected = _trimmed_one_exchange_at_a_time(conversation, max_tokens)
        counts = []

        def count(messages):
            counts.append(len(messages))
            return count_words(messages)

        turns = list(conversation.turns)
        if expected is None:
            with pytest.raises(PromptTooLong):
                conversation.trim_to_fit(count, max_tokens)
            assert conversation.turns == turns
            continue
        assert conversation.trim_to_fit(count, max_tokens) == expected
        assert conversation.turns == turns[expected:]
        assert len(counts) <= 3 + 2 * max(1, num_exchanges).bit_length()
        if expected <= 2 and num_exchanges > 1:  # a live chat: what it has, then one exchange less
            assert len(counts) == 1 + (expected > 0)


def test_trim_that_fits_drops_nothing():
    conversation = chat_of(3)
    assert conversation.trim_to_fit(count_words, 10_000) == 0
    assert len(conversation.turns) == 6


def test_message_too_long_raises_and_keeps_the_history():
    conversation = chat_of(2)
    conversation.add_user("long " * 50)
    with pytest.raises(PromptTooLong) as raised:
        conversation.trim_to_fit(count_words, 20)
    assert raised.value.max_tokens == 20 and raised.value.num_tokens > 20
    assert len(conversation.turns) == 5  # nothing dropped when the message cannot fit anyway


def test_records_round_trip():
    conversation = chat_of(2, system="you are terse")
    conversation.turns[-1].is_cut = True
    replayed = replay([header_record(target="t", draft="d"), *conversation.to_records()])
    assert replayed.conversation == conversation
    assert replayed.header["target"] == "t" and replayed.unfinished_reply is None


def test_replay_turns_streamed_chunks_without_a_reply_into_a_cut_reply():
    records = [header_record(target="t", draft="ngram"), user_record("tell me a story"),
               chunk_record("Once upon"), chunk_record(" a time")]
    replayed = replay(records)
    assert replayed.unfinished_reply == "Once upon a time"
    reply = replayed.conversation.turns[-1]
    assert reply.role == "assistant" and reply.content == "Once upon a time" and reply.is_cut


def test_replay_chunks_are_superseded_by_the_reply_record():
    records = [user_record("hi"), chunk_record("Hel"), chunk_record("lo"), assistant_record("Hello", stop_reason="end_of_generation")]
    replayed = replay(records)
    assert [message.content for message in replayed.conversation.turns] == ["hi", "Hello"]
    assert replayed.unfinished_reply is None and not replayed.conversation.turns[-1].is_cut


def test_replay_system_and_reset():
    records = [system_record("first"), user_record("a"), assistant_record("b"), reset_record(),
               system_record("second"), user_record("c"), assistant_record("d")]
    conversation = replay(records).conversation
    assert conversation.system == "second"
    assert [message.content for message in conversation.turns] == ["c", "d"]
    assert replay([system_record("x"), system_record("")]).conversation.system is None


def test_replay_counts_every_reply_asked_for_also_before_a_reset():
    """A resumed chat's next reply seed counts on from these (draws.reply_seed): after a /reset its history is
    empty, yet its replies were drawn."""
    records = [user_record("a"), assistant_record("b"), reset_record(), user_record("c"), user_record("d"),
               assistant_record("e")]
    replayed = replay(records)
    assert replayed.num_replies == 3
    assert [message.content for message in replayed.conversation.turns] == ["c", "", "d", "e"]


def test_replay_closes_a_user_message_that_got_no_reply():
    conversation = replay([user_record("a"), user_record("b"), assistant_record("c")]).conversation
    assert [(message.content, message.is_cut) for message in conversation.turns] == [
        ("a", False), ("", True), ("b", False), ("c", False)]


@pytest.mark.parametrize("records, complaint", [
    ([{"type": "gossip"}], "unknown record type"),
    (["not an object"], "unknown record type"),
    ([assistant_record("orphan")], "no user message"),
    ([chunk_record("orphan")], "no user message"),
    ([user_record("a"), header_record(target=None, draft=None)], "must come first"),
    ([{"type": "header", "version": 99}], "version"),
    ([{"type": "user", "content": 7}], "text 'content'"),
])
def test_replay_rejects_bad_records(records, complaint):
    with pytest.raises(TranscriptError, match=complaint):
        replay(records)
