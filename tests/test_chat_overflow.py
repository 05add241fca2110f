"""Chat turns on a real model: KV reuse across turns, and trimming when the conversation outgrows the context."""

from __future__ import annotations

import pytest

from pocketspec.conversation.chat import Chat
from conftest import built_engine
from pocketspec.conversation.chat_template import encode_chat
from pocketspec.conversation.conversation import Conversation

SYSTEM = "You are a helpful assistant. Answer in one or two sentences."
QUESTIONS = [
    "What is the capital of France, and what river runs through it?",
    "Name three animals that live in the ocean and say what they eat.",
    "Why is the sky blue during the day but red at sunset?",
    "What is the difference between a planet and a star?",
    "How do bees make honey from the nectar of flowers?",
    "What does a computer's processor do, in simple words?",
    "Why do leaves change colour in autumn before they fall?",
]


def _engine(target_path, **options):
    # One thread: the test machine is shared, and llama.cpp's spinning threads crawl when cores are busy.
    return built_engine(target_path, num_threads=1, **options)


def test_second_turn_prefills_only_new_tokens_on_target_and_draft(smollm2_path):
    with _engine(smollm2_path, drafter="model", draft_path=smollm2_path, gamma=3, max_context=1024) as engine:
        draft_backend = engine.model.backend
        draft_prefilled: list[int] = []
        prefill = draft_backend.prefill
        draft_backend.prefill = lambda tokens: draft_prefilled.append(len(tokens)) or prefill(tokens)
        chat = Chat(engine, Conversation(SYSTEM), max_new_tokens=48)
        first = chat.reply(QUESTIONS[0])
        draft_prefilled.clear()
        second = chat.reply(QUESTIONS[1])

    assert second.prompt_tokens[: len(first.prompt_tokens)] == first.prompt_tokens
    # The target kept the whole first turn (its last token may still be pending, not yet in the cache).
    num_turn_one = len(first.prompt_tokens) + len(first.tokens)
    assert second.stats.num_reused_tokens >= num_turn_one - 1
    num_new = len(second.prompt_tokens) - second.stats.num_reused_tokens
    assert num_new <= len(second.prompt_tokens) - num_turn_one + 1
    # The draft model caught up from its own cache too: its first pass fed the new tokens, the
    # target's first reply token and at most the last verify step of turn one (γ + 1 tokens).
    assert second.stats.steps_by_drafter.get("model", 0) > 0
    assert draft_prefilled[0] <= num_new + 1 + (3 + 1)
    assert draft_prefilled[0] < len(second.prompt_tokens) - len(first.prompt_tokens)


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_overflow_drops_oldest_turns_keeps_system_and_matches_plain(smollm2_path, drafter):
    """The reference is a plain engine given the same sequence of prompts, so both reuse their
    KV caches alike: llama.cpp's logits depend on how a prompt was split into batches, so a
    fresh prefill of a long history is not bit-identical to one built up turn by turn."""
    max_context, max_new_tokens = 256, 48
    draft_path = smollm2_path if drafter == "model" else None
    notes: list[str] = []
    num_trimmed_turns = num_model_steps = 0
    with _engine(smollm2_path, drafter=drafter, draft_path=draft_path, gamma=3 if draft_path else None,
                 max_context=max_context) as engine, \
            _engine(smollm2_path, drafter="none", max_context=max_context) as plain:
        chat = Chat(engine, Conversation(SYSTEM), max_new_tokens=max_new_tokens)
        assert chat.max_context == max_context
        tokenizer = engine.target.tokenizer
        for question in QUESTIONS:
            turn = chat.reply(question, on_note=notes.append)
            messages = chat.conversation.messages()
            assert messages[0] == {"role": "system", "content": SYSTEM}
            assert messages[-2] == {"role": "user", "content": question}
            # The prompt is the trimmed history, rendered afresh, and it fits with room for the reply.
            assert turn.prompt_tokens == encode_chat(tokenizer, chat.template, messages[:-1])
            assert len(turn.prompt_tokens) <= chat.max_prompt_tokens
            expected = plain.generate(turn.prompt_tokens, max_new_tokens)
            assert expected.stats.num_drafted == 0
            assert turn.tokens == expected.tokens
            num_model_steps += turn.stats.steps_by_drafter.get("model", 0)
            if turn.num_dropped:
                num_trimmed_turns += 1
                assert turn.num_dropped % 2 == 0  # whole exchanges, oldest first
                assert QUESTIONS[0] not in [message["content"] for message in messages]
                # Both caches rolled back to the shared start (at least the system prompt) and re-prefilled.
                assert turn.stats.num_reused_tokens < len(turn.prompt_tokens) // 2
    assert num_trimmed_turns >= 2
    assert len(notes) == num_trimmed_turns and all("dropped" in note for note in notes)
    if drafter == "model":
        assert num_model_steps > 0


def test_a_message_that_cannot_fit_names_every_way_to_make_it_fit(smollm2_path):
    """A system prompt that fills most of the context is named with its tokens, and --max-tokens is offered too:
    the reply's reserve is what the prompt cannot use."""
    from pocketspec.errors import UserError

    with _engine(smollm2_path, max_context=128) as engine:
        chat = Chat(engine, Conversation(" ".join(QUESTIONS)), max_new_tokens=40)
        with pytest.raises(UserError) as raised:
            chat.reply("Hi")
        message = str(raised.value)
        assert "40 of them kept for the reply" in message and "shorten the system prompt (" in message
        assert "lower --max-tokens" in message and "raise --max-context" in message
        chat = Chat(engine, Conversation(), max_new_tokens=40)
        message = " ".join(QUESTIONS)
        with pytest.raises(UserError) as raised:
            chat.reply(message)
        assert "shorten the message, lower --max-tokens or raise --max-context" in str(raised.value)
        num_tokens = chat.count_tokens([{"role": "user", "content": message}])
        assert num_tokens < 88 + 64 and f"needs {num_tokens} prompt tokens but at most 88 fit" in str(raised.value)
        with pytest.raises(UserError, match="needs more than 88 prompt tokens but at most 88 fit"):
            chat.reply("word " * 100_000)  # counted no further than needed
        assert chat.conversation.turns == []


def test_each_reply_samples_with_its_own_seed_so_a_reset_chat_does_not_copy_its_first(smollm2_path):
    """Draws are keyed by position: a reset (or trimmed) chat comes back to its first reply's positions, and with
    one seed for every reply it would copy that reply. The first reply is still the session's seed's."""
    question = "Name one animal, picked at random, and say one thing about it."
    with _engine(smollm2_path, drafter="ngram", temperature=1.0, seed=7, max_context=512) as engine:
        chat = Chat(engine, Conversation(), max_new_tokens=16)
        replies = []
        for _ in range(3):
            replies.append(tuple(chat.reply(question).tokens))
            chat.reset()
        assert len(set(replies)) == 3
        engine.reseed(7)
        alone = engine.generate(encode_chat(chat.tokenizer, chat.template, [{"role": "user", "content": question}]),
                                16)
        assert tuple(alone.tokens) == replies[0]
