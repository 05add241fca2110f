"""The chat's interactive loop (Repl) around the runtime's Chat (pocketspec/conversation/chat.py).

Repl reads messages (through apps/chat_prompt.py in a terminal), runs commands and turns
Ctrl-C during a reply into a clean stop.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
from pathlib import Path

import click

from apps.terminal import note
from apps.text_input import as_text
from pocketspec.atomic_file import is_same_file, refuse_output_onto_inputs
from pocketspec.conversation.chat import Chat, Turn
from pocketspec.conversation.conversation import saved_header
from pocketspec.errors import UserError
from memplanner import format_bytes
from pocketspec.conversation.transcript import TranscriptWriteFailed, save_conversation
from pocketspec.stats import drafting_text

def stats_line(stats, session) -> str:
    budget = format_bytes(session.budget_bytes) if session.budget_bytes is not None else "no budget"
    mean_gamma = f", mean γ {stats.mean_drafted_gamma:.1f}" if stats.mean_drafted_gamma else ""
    return (f"[{stats.num_tokens} tokens, {stats.tokens_per_second:.1f} tok/s, "
            f"{drafting_text(stats.num_drafted, stats.num_accepted, stats.num_steps)}{mean_gamma}, "
            f"memory {format_bytes(session.memory_in_use_bytes())} / {budget}]")


def stop_note(turn: Turn, max_new_tokens: int) -> str | None:
    if turn.stop_reason == "interrupted":
        return "[reply cut: Ctrl-C]"
    if turn.stop_reason == "context_full":
        return "[reply cut: the context is full; the oldest turns will be dropped next time]"
    if turn.stop_reason == "max_tokens":
        return f"[reply stopped at --max-tokens {max_new_tokens}]"
    return None


HELP = """\
  /help          this list
  /stats         show or hide the stats line after each reply (/stats on, /stats off)
  /reset         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt (/system alone shows it)
  /save FILE     save the conversation; continue it with --resume FILE
                 (an existing FILE is kept: /save FILE --force replaces it)
  /budget        the memory plan and the context
  /exit, /quit   quit (Ctrl-D quits too); Ctrl-C stops a reply"""


class Repl:
    def __init__(self, chat: Chat, session, prompt, *, header: dict, show_stats: bool = True):
        self.chat = chat
        self.prompt = prompt  # read() -> one message, raising EOFError / KeyboardInterrupt; keys_help
        self.session = session
        self.show_stats = show_stats
        self.header = header  # the transcript's header record, which /save writes too
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
                if rest:  # "/exit now": a message to rethink, as "/reset now" is, not a quit
                    note(f"usage: {name} (nothing after it)")
                    return True
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
        except TranscriptWriteFailed:
            self._write("\n")  # after the reply's text so far, the error's line of its own
            raise  # the chat cannot keep its turns: it ends, with that line
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

    def help(self, argument: str) -> None:
        if not _takes_nothing("/help", argument):
            return
        note("\n".join(filter(None, [HELP, self.prompt.keys_help])))

    def toggle_stats(self, argument: str) -> None:
        if argument not in ("", "on", "off"):
            note("usage: /stats [on|off]")
            return
        self.show_stats = not self.show_stats if not argument else argument == "on"
        note(f"stats {'on' if self.show_stats else 'off'}")

    def reset(self, argument: str) -> None:
        if not _takes_nothing("/reset", argument):
            return
        self.chat.reset()
        note("conversation cleared" + (" (the system prompt stays)" if self.chat.conversation.system else ""))

    def system(self, argument: str) -> None:
        if not argument:
            note(f"system prompt: {self.chat.conversation.system or '(none: the template default)'}")
            return
        try:
            self.chat.set_system(argument)
        except TranscriptWriteFailed:
            raise
        except UserError as error:
            note(f"error: {error}")
            return
        note("system prompt set")

    def save(self, argument: str) -> None:
        words = argument.rsplit(maxsplit=1)
        is_forced = words[-1:] == ["--force"]
        name = (words[0] if len(words) == 2 else "") if is_forced else argument
        if len(name) >= 2 and name[0] == name[-1] and name[0] in "'\"":  # quoted as a shell would: /save 'a b.jsonl'
            name = name[1:-1]
        if not name or "--force" in name.split():
            note("usage: /save FILE [--force]")
            return
        path = Path(name).expanduser()
        resume = f"--resume {shlex.quote(str(path.absolute()))}"  # from any folder, pasted into any shell
        live = self.chat.transcript.path if self.chat.transcript is not None else None
        if live is not None and is_same_file(path, live):
            # Replacing the live file would leave the chat appending to the unlinked old one.
            note(f"{name} is this chat's transcript: every turn is already saved there as it goes; "
                 f"continue with {resume}")
            return
        try:
            refuse_output_onto_inputs(path, self.session.choice.files_read, flag="/save")
            header = saved_header(self.header, self.chat.conversation, self.chat.num_replies)
            save_conversation(path, self.chat.conversation, header=header, replace=is_forced)
        except UserError as error:
            note(f"error: {error}")
            return
        saved = f"saved {len(self.chat.conversation.turns)} messages to {name}"
        note(f"{saved}; continue with {resume}" if path.is_file() else saved)  # not a device

    def budget(self, argument: str) -> None:
        if not _takes_nothing("/budget", argument):
            return
        plan = self.session.plan
        note(plan.describe() if plan is not None else "no --memory-budget given")
        budget = format_bytes(self.session.budget_bytes) if self.session.budget_bytes is not None else "no budget"
        note(f"context {self.chat.max_context} tokens (prompts up to {self.chat.max_prompt_tokens}, "
             f"replies up to {self.chat.max_new_tokens}); memory in use "
             f"{format_bytes(self.session.memory_in_use_bytes())} / {budget}")


def _takes_nothing(command: str, argument: str) -> bool:
    """False, with a note, when a command that takes nothing was given something (`/reset now please` is a
    message to rethink, not a reset)."""
    if argument:
        note(f"usage: {command} (nothing after it)")
    return not argument
