"""The chat's turns on an engine (Chat) and the interactive loop around them (Repl).

Chat trims the conversation to the context, renders it with the model's own template and
generates; the engine keeps the longest common prefix of its KV cache, so each turn
prefills only what is new, and after a trim both caches roll back to the system prompt.
Repl reads messages (through apps/chat_prompt.py in a terminal), runs commands and turns
Ctrl-C during a reply into a clean stop.
"""

from __future__ import annotations

import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import click

from apps.text_input import as_text
from pocketspec.atomic_file import is_same_file
from pocketspec.chat_template import encode_chat, template_for
from pocketspec.conversation import (
    Conversation, PromptTooLong, assistant_record, chunk_record, reset_record, system_record, user_record)
from pocketspec.errors import UserError
from pocketspec.transcript import TranscriptWriter, save_conversation

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
                 transcript: TranscriptWriter | None = None, stats_for: Callable | None = None):
        self.engine = engine
        self.conversation = conversation
        self.transcript = transcript
        self.max_new_tokens = max_new_tokens
        self.stats_for = stats_for or (lambda stats: stats.as_dict())
        self.tokenizer = engine.target.tokenizer
        self.template = template_for(self.tokenizer)
        self.max_context = engine.target.max_context
        # The prompt leaves room for a reply; a longer reply stops with "context_full".
        self.max_prompt_tokens = self.max_context - min(max_new_tokens, self.max_context // 2)

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(encode_chat(self.tokenizer, self.template, messages))

    def prompt_tokens(self) -> list[int]:
        return encode_chat(self.tokenizer, self.template, self.conversation.messages())

    def record(self, record: dict, *, sync: bool = True) -> None:
        if self.transcript is not None:
            self.transcript.append(record, sync=sync)

    def set_system(self, text: str | None) -> None:
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
            num_dropped = self.conversation.trim_to_fit(self.count_tokens, self.max_prompt_tokens)
        except PromptTooLong as error:
            self.conversation.drop_pending()
            raise UserError(f"{error} (context {self.max_context} tokens): shorten the message or raise --max-context") from None
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

        try:
            result = self.engine.generate(prompt, self.max_new_tokens, should_stop=should_stop,
                                          on_tokens=lambda tokens: show(streamer.push(tokens)))
        except KeyboardInterrupt:  # a Ctrl-C that no handler turned into a clean stop (piped stdin)
            self._close_reply("".join(pieces), is_cut=True, stop_reason="interrupted")
            raise
        except BaseException:
            self._close_reply("".join(pieces), is_cut=True, stop_reason="error")
            raise
        show(streamer.flush())
        turn = Turn("".join(pieces), result.tokens, prompt, result.stop_reason, result.stats, num_dropped)
        self._close_reply(turn.text, is_cut=turn.is_cut, stop_reason=turn.stop_reason, stats=self.stats_for(result.stats))
        return turn

    def _close_reply(self, text: str, *, is_cut: bool, stop_reason: str, stats: dict | None = None) -> None:
        self.conversation.add_assistant(text, is_cut=is_cut)
        self.record(assistant_record(text, is_cut=is_cut, stop_reason=stop_reason, stats=stats))


def stats_line(stats, session) -> str:
    from memplanner.sizes import format_bytes

    budget = format_bytes(session.budget_bytes) if session.budget_bytes is not None else "no budget"
    return (f"[{stats.num_tokens} tokens, {stats.tokens_per_second:.1f} tok/s, "
            f"acceptance {stats.acceptance_rate:.0%}, {stats.mean_accepted_per_step:.2f} accepted/step, "
            f"γ {stats.last_gamma}, memory {format_bytes(session.memory_in_use_bytes())} / {budget}]")


def stop_note(turn: Turn, max_new_tokens: int) -> str | None:
    if turn.stop_reason == "interrupted":
        return "[reply cut: Ctrl-C]"
    if turn.stop_reason == "context_full":
        return "[reply cut: the context is full; the oldest turns will be dropped next time]"
    if turn.stop_reason == "max_tokens":
        return f"[reply stopped at --max-tokens {max_new_tokens}]"
    return None


def note(text: str) -> None:
    click.echo(text, err=True)


HELP = """\
  /help          this list
  /stats         show or hide the stats line after each reply
  /reset         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt (/system alone shows it)
  /save FILE     save the conversation; continue it with --resume FILE
                 (an existing FILE is kept: /save FILE --force replaces it)
  /budget        the memory plan and the context
  /exit          quit (Ctrl-D quits too); Ctrl-C stops a reply"""


class Repl:
    def __init__(self, chat: Chat, session, prompt, *, show_stats: bool = True, models: tuple[str, str] = ("", "")):
        self.chat = chat
        self.prompt = prompt  # read() -> one message, raising EOFError / KeyboardInterrupt; keys_help
        self.session = session
        self.show_stats = show_stats
        self.models = models  # target and draft, as the transcript header names them
        self._is_interrupted = False
        self.commands = {"/help": self.help, "/stats": self.toggle_stats, "/reset": self.reset, "/system": self.system,
                         "/save": self.save, "/budget": self.budget, "/exit": None, "/quit": None}

    def run(self) -> None:
        # A parent that started us with SIGINT ignored (a background job of a script) would
        # leave Ctrl-C dead in an interactive chat: take the default handler back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        while True:
            try:
                line = as_text(self.prompt.read(), "your message").strip()
                if line and not self._handle(line):
                    return
            except EOFError:
                return
            except KeyboardInterrupt:  # like a shell: Ctrl-C drops the line being typed
                click.echo("(Ctrl-D or /exit quits)", err=True)

    def _handle(self, line: str) -> bool:
        """Run a command or answer a message; False means quit."""
        name, *rest = line.split(maxsplit=1)
        if name in self.commands:
            if self.commands[name] is None:
                return False
            self.commands[name](rest[0] if rest else "")
        elif re.fullmatch(r"/[a-zA-Z]+", name):
            note(f"unknown command {name}; /help lists the commands")
        else:
            self.answer(line)
        return True

    def _on_sigint(self, signum, frame) -> None:
        self._is_interrupted = True

    def answer(self, text: str) -> None:
        # During a reply Ctrl-C only sets a flag that the engine reads between steps, so
        # KeyboardInterrupt never lands inside a native llama.cpp call.
        self._is_interrupted = False
        previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            turn = self.chat.reply(text, on_text=self._write, on_note=note, should_stop=lambda: self._is_interrupted)
        except UserError as error:
            note(f"error: {error}")
            return
        finally:
            signal.signal(signal.SIGINT, previous_handler)
        self._write("\n")
        stop = stop_note(turn, self.chat.max_new_tokens)
        if stop is not None:
            note(stop)
        if self.show_stats:
            note(stats_line(turn.stats, self.session))

    @staticmethod
    def _write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def help(self, _argument: str) -> None:
        note("\n".join(filter(None, [HELP, self.prompt.keys_help])))

    def toggle_stats(self, _argument: str) -> None:
        self.show_stats = not self.show_stats
        note(f"stats {'on' if self.show_stats else 'off'}")

    def reset(self, _argument: str) -> None:
        self.chat.reset()
        note("conversation cleared" + (" (the system prompt stays)" if self.chat.conversation.system else ""))

    def system(self, argument: str) -> None:
        if not argument:
            note(f"system prompt: {self.chat.conversation.system or '(none: the template default)'}")
            return
        self.chat.set_system(argument)
        note("system prompt set")

    def save(self, argument: str) -> None:
        words = argument.rsplit(maxsplit=1)
        is_forced = words[-1:] == ["--force"]
        name = (words[0] if len(words) == 2 else "") if is_forced else argument
        if not name:
            note("usage: /save FILE [--force]")
            return
        path = Path(name).expanduser()
        live = self.chat.transcript.path if self.chat.transcript is not None else None
        if live is not None and is_same_file(path, live):
            # Replacing the live file would leave the chat appending to the unlinked old one.
            note(f"{name} is this chat's transcript: every turn is already saved there as it goes; "
                 f"continue with --resume {name}")
            return
        try:
            save_conversation(path, self.chat.conversation, target=self.models[0], draft=self.models[1],
                              replace=is_forced)
        except UserError as error:
            note(f"error: {error}")
            return
        note(f"saved {len(self.chat.conversation.turns)} messages to {name}; continue with --resume {name}")

    def budget(self, _argument: str) -> None:
        from memplanner.sizes import format_bytes

        plan = self.session.plan
        if plan is None:
            note("no --memory-budget given")
        elif hasattr(plan, "describe"):
            note(plan.describe())
        else:
            from apps.budget import describe

            note(describe(plan))
        budget = format_bytes(self.session.budget_bytes) if self.session.budget_bytes is not None else "no budget"
        note(f"context {self.chat.max_context} tokens (prompts up to {self.chat.max_prompt_tokens}, "
             f"replies up to {self.chat.max_new_tokens}); memory in use "
             f"{format_bytes(self.session.memory_in_use_bytes())} / {budget}")
