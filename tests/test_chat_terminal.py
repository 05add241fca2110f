"""`pocketspec chat` as people use it: in a pseudo-terminal, through a pipe, killed mid-reply, and with bad input."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import hang_up_as_a_terminal_does, home_with_measurements
from test_cli_errors import assert_one_line_error
from pocketspec.conversation.transcript import load_transcript, read_records

pexpect = pytest.importorskip("pexpect")

POCKETSPEC = Path(sys.executable).parent / "pocketspec"
SMOLLM2 = ["--target", "smollm2-135m-instruct", "--draft", "ngram", "--threads", "1"]
LONG_REQUEST = "Write a long story about a dragon who learns to read."  # smollm2 runs past 1000 tokens
TIMEOUT_SECONDS = 120


@pytest.fixture
def chat_home(tmp_path, smollm2_path) -> Path:
    """A fresh POCKETSPEC_HOME (chats, history) with the session's models and measured costs."""
    return home_with_measurements(tmp_path / "home")


def _env(home: Path) -> dict:
    return {**os.environ, "POCKETSPEC_HOME": str(home), "TERM": "dumb"}


def _spawn(home: Path, *args: str, target: str = "smollm2-135m-instruct", cwd: Path | None = None):
    flags = ["--target", target, *SMOLLM2[2:]]
    child = pexpect.spawn(str(POCKETSPEC), ["chat", *flags, *args], env=_env(home), encoding="utf-8", cwd=cwd,
                          timeout=TIMEOUT_SECONDS, dimensions=(50, 200), preexec_fn=hang_up_as_a_terminal_does)
    child.logfile_read = io.StringIO()
    child.expect("/help for commands")
    child.expect("> ")
    return child


def _say(child, text: str) -> None:
    """Send a line and wait for the next prompt."""
    child.sendline(text)
    child.expect("\r\n> ")


def _start_long_reply(child) -> str:
    """Send LONG_REQUEST and return once a few words of the reply are on the screen."""
    child.sendline(LONG_REQUEST)
    child.expect_exact(LONG_REQUEST + "\r\n")  # the terminal's echo of the line
    child.expect(r"(\w+\W+){8}")
    return child.after.replace("\r\n", "\n")


def _screen(child) -> str:
    return child.logfile_read.getvalue().replace("\r\n", "\n")


def _only_transcript(home: Path) -> Path:
    paths = list((home / "chats").glob("*.jsonl"))
    assert len(paths) == 1, paths
    return paths[0]


def test_two_turns_stats_ctrl_c_and_exit(chat_home):
    child = _spawn(chat_home, "--max-tokens", "1500")
    _say(child, "What is 2+2?")
    assert "tok/s" in child.before and "memory" in child.before
    assert "accepted/step" in child.before or "nothing drafted" in child.before
    _say(child, "And what is 3+3?")
    _say(child, "/stats")
    assert "stats off" in child.before
    shown_before_cut = _start_long_reply(child)
    child.sendcontrol("c")
    child.expect_exact("[reply cut: Ctrl-C]")
    child.expect("\r\n> ")
    _say(child, "Thank you!")
    assert "tok/s" not in child.before  # /stats turned the stats line off
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, _screen(child)
    screen = _screen(child)
    assert "Traceback" not in screen

    conversation = load_transcript(_only_transcript(chat_home)).conversation
    roles = [message.role for message in conversation.turns]
    assert roles == ["user", "assistant"] * 4
    users = [message.content for message in conversation.turns[0::2]]
    assert users == ["What is 2+2?", "And what is 3+3?", LONG_REQUEST, "Thank you!"]
    replies = conversation.turns[1::2]
    assert [reply.is_cut for reply in replies] == [False, False, True, False]
    assert shown_before_cut in replies[2].content
    for reply in replies:
        assert reply.content.strip() and reply.content in screen.replace("^C", ""), screen
    records = read_records(_only_transcript(chat_home))
    cut = [record for record in records if record["type"] == "assistant" and record["cut"]]
    assert [record["stop_reason"] for record in cut] == ["interrupted"]
    assert cut[0]["stats"]["num_tokens"] < 1500


def test_ctrl_c_at_the_prompt_clears_the_line_and_ctrl_d_quits(chat_home):
    child = _spawn(chat_home)
    child.send("half a line")
    child.sendcontrol("c")
    child.expect_exact("Ctrl-D or /exit quits")
    child.expect("> ")
    child.sendline("/help")
    child.expect_exact("/budget")
    child.expect("> ")
    child.sendline("/budget")
    child.expect_exact("no --memory-budget given")
    child.expect("> ")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in _screen(child)


def test_budget_shows_the_torch_plan(chat_home):
    child = _spawn(chat_home, "--backend", "torch", "--max-context", "512", "--memory-budget", "3GiB")
    child.sendline("/budget")
    child.expect_exact("memory plan (torch): predicted peak")
    child.expect_exact("of 3.00 GiB")
    child.expect("context 512 tokens")
    child.expect("> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    screen = _screen(child)
    assert child.exitstatus == 0 and "no --memory-budget given" not in screen and "Traceback" not in screen


def test_transcript_survives_kill_and_resumes(chat_home):
    child = _spawn(chat_home, "--max-tokens", "1500")
    _say(child, "What is 2+2?")
    shown = _start_long_reply(child)
    child.kill(signal.SIGKILL)
    child.expect(pexpect.EOF)
    child.close()
    path = _only_transcript(chat_home)

    replayed = load_transcript(path)
    first_reply = replayed.conversation.turns[1].content
    assert [message.role for message in replayed.conversation.turns] == ["user", "assistant"] * 2
    assert replayed.conversation.turns[0].content == "What is 2+2?"
    assert shown in replayed.unfinished_reply  # nothing shown before the kill was lost
    assert replayed.conversation.turns[3].is_cut

    child = _spawn(chat_home, "--resume", str(path), "--max-tokens", "64")  # returns at the history's "> "
    child.expect_exact("[reply cut]")
    child.expect("> ")
    assert "resumed 4 messages" in _screen(child) and "> What is 2+2?" in _screen(child)
    _say(child, "Thank you!")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, _screen(child)

    turns = load_transcript(path).conversation.turns
    assert [message.content for message in turns[0::2]] == ["What is 2+2?", LONG_REQUEST, "Thank you!"]
    assert turns[1].content == first_reply and not turns[1].is_cut
    assert turns[3].is_cut and shown in turns[3].content
    assert turns[5].content.strip() and not turns[5].is_cut
    killed = [record for record in read_records(path) if record.get("stop_reason") == "killed"]
    assert len(killed) == 1  # the resume closed the dead reply once, in the file too


def test_piped_stdin_prints_only_the_reply(chat_home):
    result = subprocess.run(
        [str(POCKETSPEC), "chat", "--target", "smollm2-135m-instruct", "--draft", "ngram", "--max-tokens", "16"],
        input="hi\n", capture_output=True, text=True, env=_env(chat_home), timeout=TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "/help" not in result.stdout and "tok/s" not in result.stdout
    assert "tok/s" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("case", ["missing", "corrupt", "not_a_transcript", "fifo", "unknown_model"])
def test_bad_input_is_one_line_and_exit_2(chat_home, tmp_path, case):
    args = ["chat", *SMOLLM2]
    if case == "missing":
        args += ["--resume", str(tmp_path / "nope.jsonl")]
    elif case == "corrupt":
        path = tmp_path / "corrupt.jsonl"
        path.write_text('{"type": "header", "version": 1}\nnot json at all\n{"type": "reset"}\n')
        args += ["--resume", str(path)]
    elif case == "fifo":  # opening it waited for a writer for good
        path = tmp_path / "fifo"
        os.mkfifo(path)
        args += ["--resume", str(path)]
    elif case == "not_a_transcript":
        path = tmp_path / "other.jsonl"
        path.write_text('{"type": "assistant", "content": "a reply to nothing"}\n')
        args += ["--resume", str(path)]
    else:
        args = ["chat", "--target", "no-such-model", "--draft", "ngram"]
    result = subprocess.run([str(POCKETSPEC), *args], input="hi", capture_output=True, text=True,
                            env=_env(chat_home), timeout=TIMEOUT_SECONDS)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


def test_resume_with_only_draft_keeps_the_transcripts_target(chat_home, tmp_path):
    """The header's target is used unless --target or --pair names another; --draft alone does not (it loaded the
    default pair's target). Its target here is a name no catalog has, so the run must say so."""
    path = tmp_path / "header.jsonl"
    path.write_text('{"type": "header", "version": 1, "target": "no-such-model", "draft": "ngram"}\n')
    result = subprocess.run([str(POCKETSPEC), "chat", "--draft", "none", "--threads", "1", "--max-tokens", "2",
                             "--resume", str(path)], input="hi", capture_output=True, text=True,
                            env=_env(chat_home), timeout=TIMEOUT_SECONDS)
    assert result.returncode == 2 and "no-such-model" in result.stderr, result.stderr


def test_resume_runs_on_the_transcripts_backend(chat_home):
    """A self-sparse chat runs on torch only: --resume takes the header's backend unless --backend names one."""
    def chat(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(POCKETSPEC), "chat", "--threads", "1", "--max-tokens", "3", *args], input="hi",
                              capture_output=True, text=True, env=_env(chat_home), timeout=TIMEOUT_SECONDS)

    first = chat("--target", "smollm2-135m-instruct", "--backend", "torch", "--draft", "self-sparse")
    assert first.returncode == 0, first.stderr
    (path,) = (chat_home / "chats").glob("*.jsonl")
    assert read_records(path)[0]["backend"] == "torch"
    resumed = chat("--resume", str(path))
    assert resumed.returncode == 0, resumed.stderr
    assert _users(path) == ["hi", "hi"]
    # --target names the models, and with them the backend: the default one, which reads --kv-type
    other = chat("--resume", str(path), "--target", "smollm2-135m-instruct", "--draft", "ngram", "--kv-type", "q8_0")
    assert other.returncode == 0, other.stderr
    # the transcript's self-draft is named as the transcript's, and --draft as the way out
    assert_one_line_error(chat("--resume", str(path), "--backend", "llama.cpp"), "drafted with self-sparse",
                          "--backend torch only", "give --draft")
    switched = chat("--resume", str(path), "--backend", "llama.cpp", "--draft", "ngram")
    assert switched.returncode == 0, switched.stderr


def _quit(child) -> str:
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, _screen(child)
    assert "Traceback" not in _screen(child)
    return _screen(child)


def _past_the_history(child) -> None:
    """After a resume's shown history: wait for the prompt that follows the output of /help."""
    child.sendline("/help")
    child.expect_exact("Ctrl-C stops a reply")
    child.expect("\r\n> ")


def _users(path: Path) -> list[str]:
    return [message.content for message in load_transcript(path).conversation.turns if message.role == "user"]


def test_save_onto_the_live_transcript_keeps_later_turns(chat_home):
    """The help's own sequence: chat, --resume F, /save F, more turns: every turn stays in F."""
    child = _spawn(chat_home, "--max-tokens", "16")
    _say(child, "What is 2+2?")
    _quit(child)
    path = _only_transcript(chat_home)

    child = _spawn(chat_home, "--resume", str(path), "--max-tokens", "16")
    _past_the_history(child)
    _say(child, f"/save {path}")
    assert "is this chat's transcript" in child.before
    _say(child, "And 3+3?")
    link = chat_home / "link.jsonl"
    link.symlink_to(path)
    _say(child, f"/save {link} --force")  # the same file by another name, even forced
    assert "is this chat's transcript" in child.before
    _say(child, "Thank you!")
    _quit(child)
    assert _users(path) == ["What is 2+2?", "And 3+3?", "Thank you!"]


def test_save_never_replaces_a_file_unless_forced(chat_home, tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("precious")
    child = _spawn(chat_home, "--max-tokens", "16")
    _say(child, "What is 2+2?")
    _say(child, f"/save {precious}")
    assert "already exists; add --force" in child.before
    assert precious.read_text() == "precious"
    fresh = tmp_path / "saved.jsonl"
    _say(child, f"/save '{fresh}'")  # quoted as a shell would be: it made folders named after the quote
    assert f"saved 2 messages to {fresh}" in child.before
    _say(child, f"/save {precious} --force")
    assert f"saved 2 messages to {precious}" in child.before
    _say(child, "/reset")
    _say(child, "And 3+3?")
    after_reset = tmp_path / "after_reset.jsonl"
    _say(child, f"/save {after_reset}")
    _quit(child)
    assert _users(precious) == _users(fresh) == ["What is 2+2?"]
    # the file holds the turn after the /reset, and counts the reply before it (a resumed chat's seeds go on)
    assert _users(after_reset) == ["And 3+3?"] and load_transcript(after_reset).num_replies == 2


def test_save_refuses_a_model_a_folder_a_device_and_another_chats_transcript(chat_home, tmp_path, smollm2_path):
    """/save --force replaces a file the user names, never the model the chat runs on, a folder, nor a
    transcript another chat is writing (that chat would go on appending to the file it replaced); a device is
    written through, with no --resume hint; the hint works from any folder and in any shell. The chat runs on a
    copy of the model: a regression replaces that one, not the models every other test reads."""
    model = tmp_path / "model" / "smollm2.gguf"
    model.parent.mkdir()
    shutil.copyfile(smollm2_path, model)
    other = _spawn(chat_home, "--max-tokens", "8")
    _say(other, "What is 2+2?")
    others_transcript = _only_transcript(chat_home)
    child = _spawn(chat_home, "--max-tokens", "8", target=str(model), cwd=tmp_path)
    _say(child, "What is 3+3?")
    model_bytes = model.stat().st_size
    for target, fragment in ((model, "is the --target file"), (tmp_path, "is a folder"),
                             (others_transcript, "is open in another chat; save to another file")):
        _say(child, f"/save {target} --force")
        assert fragment in child.before, child.before
    _say(child, "/save /dev/null")
    assert "saved 2 messages to /dev/null" in child.before and "--resume" not in child.before
    _say(child, f"/save {tmp_path / 'x.jsonl'} --force --force")
    assert "usage: /save FILE [--force]" in child.before
    spaced = tmp_path / "my chat.jsonl"
    _say(child, "/save my chat.jsonl")  # relative: in the chat's folder, the hint absolute
    assert f"continue with --resume '{spaced}'" in child.before.replace("\r\n", "")
    _quit(child)
    _say(other, "And 4+4?")
    _quit(other)
    assert model.stat().st_size == model_bytes
    assert _users(others_transcript) == ["What is 2+2?", "And 4+4?"] and _users(spaced) == ["What is 3+3?"]


def test_stats_on_and_off_commands_that_take_nothing_and_a_system_prompt_past_the_context(chat_home):
    child = _spawn(chat_home, "--max-tokens", "8", "--max-context", "256", "--no-stats")
    for command, shown in (("/stats on", "stats on"), ("/stats on", "stats on"), ("/stats off", "stats off"),
                           ("/stats maybe", "usage: /stats [on|off]"), ("/reset now please", "usage: /reset"),
                           ("/exit now", "usage: /exit (nothing after it)")):  # it quit at once
        _say(child, command)
        assert shown in child.before, child.before
    _say(child, "/system " + "Always answer in rhyme. " * 60)
    assert "leaving no room for a message" in child.before and "shorten it" in child.before
    _say(child, "/system")
    assert "(none: the template default)" in child.before
    _say(child, "What is 2+2?")  # room for a message still
    _quit(child)
    assert _users(_only_transcript(chat_home)) == ["What is 2+2?"]


def test_a_closed_terminal_before_the_first_message_leaves_no_transcript(chat_home):
    child = _spawn(chat_home)
    child.kill(signal.SIGHUP)
    child.expect(pexpect.EOF)
    child.close()
    assert child.signalstatus is None and child.exitstatus == 128 + signal.SIGHUP, _screen(child)
    assert not list((chat_home / "chats").glob("*.jsonl"))


def test_resume_by_name_and_a_torn_last_line(chat_home, tmp_path):
    """--resume NAME finds the chat in POCKETSPEC_HOME/chats; a torn tail is set aside once, in one line."""
    child = _spawn(chat_home, "--max-tokens", "16")
    _say(child, "What is 2+2?")
    _quit(child)
    path = _only_transcript(chat_home)
    original = path.read_bytes() + b'{"type": "chunk", "te'
    path.write_bytes(original)

    child = pexpect.spawn(str(POCKETSPEC), ["chat", *SMOLLM2, "--resume", path.stem, "--max-tokens", "16"],
                          env=_env(chat_home), encoding="utf-8", timeout=TIMEOUT_SECONDS, dimensions=(50, 200),
                          cwd=str(tmp_path))
    child.logfile_read = io.StringIO()
    child.expect("/help for commands")
    _past_the_history(child)
    _say(child, "Thank you!")
    screen = _quit(child)
    copies = list(path.parent.glob(path.name + ".torn-*"))
    assert len(copies) == 1 and copies[0].read_bytes() == original
    assert screen.count("cut mid-write") == 1 and str(copies[0]) in screen
    assert _users(path) == ["What is 2+2?", "Thank you!"]


@pytest.mark.parametrize("signum, exit_code, stop_reason", [(signal.SIGINT, 130, "interrupted"),
                                                             (signal.SIGTERM, 143, "terminated")])
def test_a_signal_on_a_piped_reply_is_recorded(chat_home, signum, exit_code, stop_reason):
    process = subprocess.Popen(
        [str(POCKETSPEC), "chat", *SMOLLM2, "--max-tokens", "1500"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=_env(chat_home), text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    process.stdin.write(LONG_REQUEST + "\n")
    process.stdin.close()
    process.stdout.read(40)  # the reply is streaming
    process.send_signal(signum)
    process.stdout.read()
    stderr = process.stderr.read()
    assert process.wait(timeout=TIMEOUT_SECONDS) == exit_code and "Traceback" not in stderr, stderr
    replies = [record for record in read_records(_only_transcript(chat_home)) if record["type"] == "assistant"]
    assert [(reply["cut"], reply["stop_reason"]) for reply in replies] == [(True, stop_reason)]


def test_a_reader_that_leaves_cuts_the_reply_as_output_closed(chat_home):
    """`pocketspec chat | head -c 20`: no traceback, and the transcript says why the reply ends where it does."""
    process = subprocess.Popen(
        [str(POCKETSPEC), "chat", *SMOLLM2, "--max-tokens", "1500"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=_env(chat_home), text=True)
    process.stdin.write(LONG_REQUEST + "\n")
    process.stdin.close()
    process.stdout.read(20)
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(timeout=TIMEOUT_SECONDS)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    replies = [record for record in read_records(_only_transcript(chat_home)) if record["type"] == "assistant"]
    assert [(reply["cut"], reply["stop_reason"]) for reply in replies] == [(True, "output_closed")]


def test_the_banner_and_the_transcript_name_the_drafter_and_the_verify_mode_that_run(tmp_path, qwen_target_path, qwen_draft_path):
    """A pair whose draft model cannot pay on this machine is left unloaded (the loader says so); the banner
    then names the n-gram drafter that runs, not the pair's draft. It names the verify mode too: exact on
    llama.cpp's CPU backend with the row-exact kernels (the default there), fast without them."""
    home = home_with_measurements(tmp_path / "home")
    child = pexpect.spawn(str(POCKETSPEC), ["chat", "--pair", "qwen-coder", "--threads", "1", "--max-context", "1024",
                                            "--max-tokens", "2"],
                          env=_env(home), encoding="utf-8", timeout=300, dimensions=(50, 200))
    child.logfile_read = io.StringIO()
    child.expect("/help for commands")
    screen = _screen(child)
    banner = next(line for line in screen.splitlines() if line.startswith("chat with "))
    from pocketspec.backends.ggml_ops import row_exact_max_rows

    verify = "exact" if row_exact_max_rows() else "fast"
    if f"draft model {qwen_draft_path.name} not loaded" in screen:
        assert f"(draft: ngram, verify: {verify})" in banner, screen
    else:
        assert f"(draft: {qwen_draft_path.stem}, verify: {verify})" in banner, screen
    # the transcript's header names that drafter too: a --resume loads what ran, not the pair's draft as if named
    child.expect("> ")
    _say(child, "hi")
    _quit(child)
    drafting = banner.split("(draft: ")[1].split(",")[0]
    assert read_records(_only_transcript(home))[0]["draft"] == drafting


def test_a_transcript_the_disk_refuses_mid_reply_ends_the_chat_with_one_line(chat_home):
    """A full disk while a reply streams (here the file size limit, `ulimit -f`): the chat cannot keep its turns,
    so it ends with exit code 2 and one line naming the transcript, not "cannot write the output" (stdout was
    fine), and not an error per message in a chat that goes on without its transcript."""
    command = f"ulimit -f 2; exec {POCKETSPEC} chat --target smollm2-135m-instruct {' '.join(SMOLLM2[2:])} " \
              "--max-tokens 1500"
    child = pexpect.spawn("/bin/sh", ["-c", command], env=_env(chat_home), encoding="utf-8",
                          timeout=TIMEOUT_SECONDS, dimensions=(50, 200))
    child.logfile_read = io.StringIO()
    child.expect("> ")
    child.sendline(LONG_REQUEST)
    child.expect(r"\r\nerror: cannot write the chat transcript \S+chat-\S+\.jsonl: File too large\r\n")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2, child.logfile_read.getvalue()
    assert "Traceback" not in child.logfile_read.getvalue()


def test_redirected_stdout_in_a_dumb_terminal_gets_the_replies_alone(chat_home, tmp_path):
    """`chat > replies.txt` where TERM=dumb: the prompt shows on the terminal (stderr), the file holds the replies."""
    replies = tmp_path / "replies.txt"
    command = " ".join([str(POCKETSPEC), "chat", *SMOLLM2, "--max-tokens", "8", "--no-stats", ">", str(replies)])
    child = pexpect.spawn("/bin/sh", ["-c", command], env=_env(chat_home), encoding="utf-8",
                          timeout=TIMEOUT_SECONDS, dimensions=(50, 200))
    child.logfile_read = io.StringIO()
    child.expect("/help for commands")
    child.expect("> ")
    _say(child, "What is 2+2?")
    _quit(child)
    written = replies.read_text()
    assert written.strip() and "> " not in written and "What is 2+2?" not in written, written
    (transcript,) = (chat_home / "chats").glob("*.jsonl")
    assert written.strip() == load_transcript(transcript).conversation.turns[-1].content.strip()


def test_a_message_that_fills_a_dumb_terminals_line_says_so(chat_home):
    """A terminal in line mode keeps 4095 bytes of a line and drops the rest: the chat says so, once."""
    child = _spawn(chat_home, "--max-tokens", "2", "--no-stats")
    _say(child, "word " * 1000)
    assert "filled the terminal's line (4095 bytes)" in child.before, child.before
    _say(child, "What is 2+2?")
    assert "filled the terminal's line" not in child.before
    _quit(child)
