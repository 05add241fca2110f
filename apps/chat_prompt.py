"""The chat's prompt in a terminal: line editing, history across restarts, multi-line messages.

prompt_toolkit (the library IPython and ptpython use) reads each message. Enter sends it;
Esc-Enter (Alt-Enter) starts a new line, and a pasted block of lines arrives as one message.
Up and Down walk the history, kept in POCKETSPEC_HOME/chat_history. Ctrl-C raises
KeyboardInterrupt and Ctrl-D on an empty line EOFError, as input() does, so the REPL treats
both the same either way. Between two prompts the terminal is back in its usual mode, where
Ctrl-C during a reply is a SIGINT as before. A dumb terminal keeps plain input(); piped
stdin never comes here (chat_cmd answers it as one message).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterable

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.output import create_output
from prompt_toolkit.utils import is_dumb_terminal

from pocketspec.models.catalog import pocketspec_home

PROMPT = "> "
CONTINUATION = ". "  # before the second and later lines of a message; as wide as PROMPT
TERMINAL_LINE_BYTES = 4095  # the most Linux's terminal in line mode holds of one line
KEYS_HELP = """\
  Enter sends; Esc-Enter (or Alt-Enter) starts a new line; a pasted block is one message
  Up/Down recall earlier messages (kept in POCKETSPEC_HOME/chat_history); Ctrl-C clears the line"""


def history_path() -> Path:
    return pocketspec_home() / "chat_history"


class KeptHistory(FileHistory):
    """The history file, or memory alone once the file cannot be read or written (saying why, once)."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.is_in_memory = False
        self._problem: str | None = None

    def load_history_strings(self) -> Iterable[str]:
        try:
            return list(super().load_history_strings())
        except OSError as error:
            self._fall_back(error, "read")
            return []

    def store_string(self, string: str) -> None:
        if self.is_in_memory:
            return
        # prompt_toolkit hands bytes that are not UTF-8 over as lone surrogates, which no file can hold
        string = string.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
        folder = Path(self.filename).parent
        try:
            if not folder.exists():  # a file there fails below, as "Not a directory"
                folder.mkdir(parents=True)
            super().store_string(string)
        except OSError as error:
            self._fall_back(error, "write")

    def _fall_back(self, error: OSError, verb: str) -> None:
        self.is_in_memory = True
        self._problem = (f"note: cannot {verb} the chat history {self.filename} ({error.strerror or error}); "
                         "this chat keeps its history in memory only")

    def take_problem(self) -> str | None:
        problem, self._problem = self._problem, None
        return problem


class TerminalPrompt:
    keys_help = KEYS_HELP

    def __init__(self, history: KeptHistory, on_note: Callable[[str], None]):
        self.history = history
        self.on_note = on_note
        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _new_line(event) -> None:
            event.current_buffer.insert_text("\n")

        # With stdout redirected, the prompt goes to the terminal on stderr.
        output = None if sys.stdout.isatty() else create_output(always_prefer_tty=True)
        self.session = PromptSession(PROMPT, history=history, key_bindings=bindings, output=output,
                                     prompt_continuation=CONTINUATION, enable_suspend=True)  # Ctrl-Z, as before

    def read(self) -> str:
        """One message; raises KeyboardInterrupt on Ctrl-C and EOFError on Ctrl-D at an empty line."""
        try:
            return self.session.prompt()
        finally:
            problem = self.history.take_problem()
            if problem is not None:
                self.on_note(problem)


class PlainPrompt:
    """input() and the terminal's own line editing: for a dumb terminal (Emacs' shell buffer edits
    the line itself) or where neither stdout nor stderr is a terminal."""

    keys_help = ""

    def __init__(self, on_note: Callable[[str], None]):
        self.on_note = on_note

    def read(self) -> str:
        # No `import readline`: it blocks SIGINT while it redraws the line, the signal then lands
        # outside its select() and Ctrl-C is ignored until the next key (CPython 3.11).
        # With stdout redirected (`chat > reply.txt` in a dumb terminal), the prompt goes to stderr,
        # as TerminalPrompt's does, and the file holds the replies alone.
        shown_on = sys.stdout if sys.stdout.isatty() else sys.stderr
        try:
            shown_on.write(PROMPT)
            shown_on.flush()
            line = input()
        except (EOFError, KeyboardInterrupt):
            print(file=shown_on)  # end the line the terminal left after "> " or "^C", as prompt_toolkit does
            raise
        if len(line.encode("utf-8", errors="surrogateescape")) >= TERMINAL_LINE_BYTES:
            self.on_note(f"note: this message filled the terminal's line ({TERMINAL_LINE_BYTES} bytes), which drops "
                         "what is typed past it; pipe a longer message in: pocketspec chat < message.txt")
        return line


def terminal_prompt(on_note: Callable[[str], None]) -> TerminalPrompt | PlainPrompt:
    # prompt_toolkit's own dumb-terminal mode shows "> " before it switches the terminal to raw
    # mode, so a key typed in between (Ctrl-D, Ctrl-C) reaches the kernel's line editor instead.
    if is_dumb_terminal() or not (sys.stdout.isatty() or sys.stderr.isatty()):
        return PlainPrompt(on_note)
    return TerminalPrompt(KeptHistory(history_path()), on_note)
