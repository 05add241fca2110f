"""One conversation on one engine (Chat): trimmed to the context, rendered with the model's own
template, streamed, and written to a transcript as it goes.

The engine keeps the longest common prefix of its KV cache, so each turn prefills only what
is new, and after a trim both caches roll back to the system prompt. The terminal loop around
it is apps/chat_repl.py; a server's chat requests are single turns and need none of this.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from pocketspec.conversation.chat_template import encode_chat, template_for
from pocketspec.conversation.conversation import (
    Conversation, PromptTooLong, assistant_record, chunk_record, reset_record, system_record, user_record)
from pocketspec.errors import UserError
from pocketspec.signals import Terminated
from pocketspec.speculation.draws import reply_seed
from pocketspec.tokenizer import counted_tokens
from pocketspec.conversation.transcript import TranscriptWriter

CUT_STOP_REASONS = ("interrupted", "context_full")


@dataclass
class Turn:
    text: str
    tokens: list[int]
    prompt_tokens: list[int]
    stop_reason: str
    stats: object  # GenerationStats
    num_dropped: int  # messages trimmed off the front of the history to make room

    @property
    def is_cut(self) -> bool:
        return self.stop_reason in CUT_STOP_REASONS


class Chat:
    """One conversation on one engine, written to a transcript as it goes."""

    def __init__(self, engine, conversation: Conversation, *, max_new_tokens: int,
                 transcript: TranscriptWriter | None = None, stats_for: Callable | None = None,
                 num_earlier_replies: int = 0):
        self.engine = engine
        self.conversation = conversation
        self.transcript = transcript
        self.max_new_tokens = max_new_tokens
        self.stats_for = stats_for or (lambda stats: stats.as_dict())
        self.tokenizer = engine.tokenizer
        self.template = template_for(self.tokenizer)
        self.max_context = engine.max_context
        # The prompt leaves room for a reply; a longer reply stops with "context_full".
        self.max_prompt_tokens = self.max_context - min(max_new_tokens, self.max_context // 2)
        # each reply samples with its own seed (draws.reply_seed), counted on from a resumed transcript's replies
        self.seed = engine.sampling.seed
        self.num_replies = num_earlier_replies

    def count_tokens(self, messages: list[dict[str, str]], max_tokens: int | None = None) -> int:
        """The messages' prompt tokens; past max_tokens, more than max_tokens but maybe not all (encode_chat)."""
        return len(encode_chat(self.tokenizer, self.template, messages, max_tokens))

    def prompt_tokens(self) -> list[int]:
        return encode_chat(self.tokenizer, self.template, self.conversation.messages())

    def record(self, record: dict, *, sync: bool = True) -> None:
        if self.transcript is not None:
            self.transcript.append(record, sync=sync)

    def set_system(self, text: str | None) -> None:
        """UserError, the prompt unchanged, when `text` leaves no room for a message in the prompt."""
        if text:
            # with an empty message after it, as a prompt renders it: a message of one token must still fit
            num_tokens = self.count_tokens([{"role": "system", "content": text}, {"role": "user", "content": ""}])
            if num_tokens >= self.max_prompt_tokens:
                raise UserError(f"the system prompt takes {num_tokens} tokens of a prompt, which holds at most "
                                f"{self.max_prompt_tokens} (context {self.max_context}, "
                                f"{self.max_context - self.max_prompt_tokens} kept for the reply), leaving no room "
                                "for a message: shorten it, lower --max-tokens or raise --max-context")
        self.conversation.system = text or None
        self.record(system_record(text))

    def reset(self) -> None:
        self.conversation.reset()
        self.record(reset_record())

    def reply(self, text: str, *, on_text: Callable[[str], None] | None = None,
              on_note: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None) -> Turn:
        """Add the user's message, trim to fit, stream the reply; raises UserError if the message cannot fit."""
        self.conversation.add_user(text)
        try:
            num_dropped = self.conversation.trim_to_fit(
                functools.partial(self.count_tokens, max_tokens=self.max_prompt_tokens), self.max_prompt_tokens)
        except PromptTooLong as error:
            self.conversation.drop_pending()
            raise UserError(self._too_long_message(error)) from None
        if num_dropped and on_note is not None:
            on_note(f"[context full: dropped the {num_dropped} oldest messages to make room; the system prompt is kept]")
        self.record(user_record(text))
        prompt = self.prompt_tokens()
        streamer = self.tokenizer.streamer()
        pieces: list[str] = []

        def show(piece: str) -> None:
            if piece:
                pieces.append(piece)
                self.record(chunk_record(piece), sync=False)  # written before shown: a kill loses nothing seen
                if on_text is not None:
                    on_text(piece)

        self.engine.reseed(reply_seed(self.seed, self.num_replies))
        self.num_replies += 1
        try:
            result = self.engine.generate(prompt, self.max_new_tokens, should_stop=should_stop,
                                          on_tokens=lambda tokens: show(streamer.push(tokens)))
        except KeyboardInterrupt:  # a Ctrl-C that no handler turned into a clean stop (piped stdin)
            self._close_reply("".join(pieces), is_cut=True, stop_reason="interrupted")
            raise
        except Terminated:  # SIGTERM (pocketspec/signals.py)
            self._close_reply("".join(pieces), is_cut=True, stop_reason="terminated")
            raise
        except BrokenPipeError:  # `| head`: the reader left
            self._close_reply("".join(pieces), is_cut=True, stop_reason="output_closed")
            raise
        except BaseException:
            self._close_reply("".join(pieces), is_cut=True, stop_reason="error")
            raise
        show(streamer.flush())
        turn = Turn("".join(pieces), result.tokens, prompt, result.stop_reason, result.stats, num_dropped)
        self._close_reply(turn.text, is_cut=turn.is_cut, stop_reason=turn.stop_reason, stats=self.stats_for(result.stats))
        return turn

    def _too_long_message(self, error: PromptTooLong) -> str:
        """What does not fit, and each way to make it fit: the system prompt's share is named when it is large."""
        reserved = self.max_context - self.max_prompt_tokens
        fixes = ["shorten the message"]
        system = self.conversation.system
        if system:
            system_tokens = self.count_tokens([{"role": "system", "content": system}])
            if 2 * system_tokens > error.max_tokens:
                fixes = [f"shorten the system prompt ({system_tokens} of those tokens) or the message"]
        fixes += ["lower --max-tokens", "raise --max-context"]
        needs = counted_tokens(error.num_tokens, error.max_tokens)  # counted no further than needed
        return (f"the message needs {needs} prompt tokens but at most {error.max_tokens} fit (context "
                f"{self.max_context} tokens, {reserved} of them kept for the reply): {', '.join(fixes[:-1])} or "
                f"{fixes[-1]}")

    def _close_reply(self, text: str, *, is_cut: bool, stop_reason: str, stats: dict | None = None) -> None:
        self.conversation.add_assistant(text, is_cut=is_cut)
        self.record(assistant_record(text, is_cut=is_cut, stop_reason=stop_reason, stats=stats))
