"""The chat's prompt (apps/chat_prompt.py): editing keys, history across restarts, multi-line messages, Ctrl-C.

The chat runs in a pseudo-terminal that says it is an xterm, so prompt_toolkit draws its
full prompt, and the keys are the bytes a terminal sends. What the chat received is read
back from its transcript, which does not depend on how the screen was drawn.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.chat_prompt import KeptHistory
from pocketspec.conversation.transcript import load_transcript, read_records
from test_chat_terminal import LONG_REQUEST, POCKETSPEC, SMOLLM2, TIMEOUT_SECONDS, chat_home  # noqa: F401 (fixture)

pexpect = pytest.importorskip("pexpect")

UP, LEFT, HOME = "\x1b[A", "\x1b[D", "\x1b[H"
ENTER, ESC_ENTER = "\r", "\x1b\r"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # bracketed paste, as a terminal wraps a pasted block
# prompt_toolkit turns bracketed paste on while it reads a message, and off once it has it
PROMPT_READY, PROMPT_DONE = "\x1b[?2004h", "\x1b[?2004l"


def _spawn(home: Path, *args: str):
    # pexpect's terminal does not answer cursor position requests, as real terminals do;
    # without this prompt_toolkit would wait for the answer and then print a warning.
    env = {**os.environ, "POCKETSPEC_HOME": str(home), "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1"}
    child = pexpect.spawn(str(POCKETSPEC), ["chat", *SMOLLM2, "--max-tokens", "8", *args], env=env,
                          encoding="utf-8", timeout=TIMEOUT_SECONDS, dimensions=(50, 200))
    child.logfile_read = io.StringIO()
    child.expect("/help for commands")
    child.expect_exact(PROMPT_READY)
    return child


def _send(child, keys: str) -> str:
    """Type keys that end a message, wait for the reply and the next prompt; returns what was shown in between."""
    child.send(keys)
    child.expect_exact(PROMPT_DONE)
    child.expect_exact(PROMPT_READY)
    return child.before


def _quit(child) -> str:
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    screen = child.logfile_read.getvalue()
    assert child.exitstatus == 0, screen
    assert "Traceback" not in screen
    return screen


def _user_messages(path: Path) -> list[str]:
    return [message.content for message in load_transcript(path).conversation.turns if message.role == "user"]


def _transcripts(home: Path) -> set[Path]:
    return set((home / "chats").glob("*.jsonl"))


def test_arrows_edit_the_line_and_recall_history_after_a_restart(chat_home):
    child = _spawn(chat_home)
    _send(child, "Sy hi" + LEFT * 4 + "a" + ENTER)  # back to after the S, insert the missing a
    _send(child, UP + " again" + ENTER)  # the last message, extended
    _send(child, "hi there" + HOME + "Say " + ENTER)
    _quit(child)
    [first] = _transcripts(chat_home)
    assert _user_messages(first) == ["Say hi", "Say hi again", "Say hi there"]

    child = _spawn(chat_home)  # a new process: the history comes from POCKETSPEC_HOME/chat_history
    _send(child, UP * 2 + ENTER)
    _quit(child)
    [second] = _transcripts(chat_home) - {first}
    assert _user_messages(second) == ["Say hi again"]  # Ctrl-D is no message: the newest is "Say hi there"
    assert "+Say hi again" in (chat_home / "chat_history").read_text()


def test_a_pasted_block_and_esc_enter_make_one_message(chat_home):
    child = _spawn(chat_home)
    _send(child, PASTE_START + "Name a fruit.\nName a colour.\n" + PASTE_END + ENTER)
    _send(child, "One" + ESC_ENTER + "Two" + ENTER)
    child.send("/help" + ENTER)
    child.expect_exact("Esc-Enter")
    child.expect_exact(PROMPT_READY)
    _quit(child)
    [path] = _transcripts(chat_home)
    assert _user_messages(path) == ["Name a fruit.\nName a colour.", "One\nTwo"]


def test_ctrl_c_clears_the_line_at_the_prompt_and_stops_a_reply(chat_home):
    child = _spawn(chat_home, "--max-tokens", "1500")
    child.send("half a line")
    child.sendcontrol("c")
    child.expect_exact("Ctrl-D or /exit quits")
    child.expect_exact(PROMPT_READY)
    _send(child, "What is 2+2?" + ENTER)
    child.send(LONG_REQUEST + ENTER)
    child.expect_exact(PROMPT_DONE)
    child.expect(r"(\w+\W+){8}")  # a few words of the reply
    child.sendcontrol("c")
    child.expect_exact("[reply cut: Ctrl-C]")
    child.expect_exact(PROMPT_READY)
    _quit(child)
    [path] = _transcripts(chat_home)
    assert _user_messages(path) == ["What is 2+2?", LONG_REQUEST]
    cut = [record for record in read_records(path) if record["type"] == "assistant" and record["cut"]]
    assert [record["stop_reason"] for record in cut] == ["interrupted"]
    assert cut[0]["stats"]["num_tokens"] < 1500


def test_a_history_file_that_cannot_be_used_leaves_the_chat_working(chat_home):
    (chat_home / "chat_history").mkdir()  # neither readable nor writable as a file, even by root
    child = _spawn(chat_home)
    shown = _send(child, "Say hi" + ENTER)
    assert "cannot read the chat history" in shown
    shown = _send(child, UP + ENTER)  # this session's history still works, in memory
    assert "chat history" not in shown  # said once
    screen = _quit(child)
    assert screen.count("chat history") == 1
    [path] = _transcripts(chat_home)
    assert _user_messages(path) == ["Say hi", "Say hi"]


def test_piped_stdin_needs_no_prompt_toolkit(chat_home):
    no_prompt_toolkit = ("import sys; sys.modules['prompt_toolkit'] = None; "
                         "from apps.cli import main; sys.argv[0] = 'pocketspec'; main()")
    env = {**os.environ, "POCKETSPEC_HOME": str(chat_home)}
    result = subprocess.run([sys.executable, "-c", no_prompt_toolkit, "chat", *SMOLLM2, "--max-tokens", "8"],
                            input="hi\n", capture_output=True, text=True, env=env, timeout=TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and "Traceback" not in result.stderr
    assert not (chat_home / "chat_history").exists()


def test_history_keeps_multi_line_messages_across_instances(tmp_path):
    path = tmp_path / "home" / "chat_history"  # its folder does not exist yet
    KeptHistory(path).append_string("first\nsecond line")
    KeptHistory(path).append_string("third")
    history = KeptHistory(path)
    assert list(history.load_history_strings()) == ["third", "first\nsecond line"]
    assert history.take_problem() is None


def test_history_file_holds_stray_bytes_as_replacement_characters(tmp_path):
    path = tmp_path / "chat_history"
    KeptHistory(path).append_string("caf\udce9 au lait")  # the byte 0xe9 (Latin-1 é), as prompt_toolkit decodes it
    assert list(KeptHistory(path).load_history_strings()) == ["caf\ufffd au lait"]


@pytest.mark.parametrize("blocker", ["parent_is_a_file", "history_is_a_folder"])
def test_history_that_cannot_be_written_is_kept_in_memory_and_said_once(tmp_path, blocker):
    if blocker == "parent_is_a_file":
        (tmp_path / "home").write_text("")
        path = tmp_path / "home" / "chat_history"
    else:
        path = tmp_path / "chat_history"
        path.mkdir()
    history = KeptHistory(path)
    history.append_string("one")
    history.append_string("two")
    assert history.get_strings() == ["one", "two"]
    assert history.is_in_memory and str(path) in history.take_problem()
    assert history.take_problem() is None
