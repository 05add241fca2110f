"""Text that is not UTF-8 becomes U+FFFD with one note, at every entry point of the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from apps import text_input
from apps.text_input import as_text, decode_bytes
from conftest import home_with_measurements

STRAY = b"caf\xe9 \xff\xfe na\xefve"  # Latin-1 bytes and two that are never UTF-8


@pytest.fixture(autouse=True)
def fresh_notes():
    text_input._noted_sources.clear()


@given(data=st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_any_bytes_become_encodable_text(data):
    text_input._noted_sources.clear()
    from_argv = os.fsdecode(data)  # how Python hands argv bytes over: surrogateescape
    for text in (decode_bytes(data, "stdin"), as_text(from_argv, "--prompt")):
        text.encode("utf-8")  # never raises
    is_utf8 = True
    try:
        expected = data.decode("utf-8")
    except UnicodeDecodeError:
        is_utf8 = False
    if is_utf8:
        assert as_text(from_argv, "--prompt") == expected
        assert decode_bytes(data, "x") == expected.removeprefix("\ufeff")  # a file's byte-order mark is not text


def test_a_byte_order_mark_is_dropped_from_a_file_or_stdin_but_not_from_the_middle():
    assert decode_bytes(b"\xef\xbb\xbfThe sky is", "stdin") == "The sky is"
    assert decode_bytes(b"a\xef\xbb\xbfb", "stdin") == "a\ufeffb"


@given(text=st.text(max_size=100))
def test_valid_text_is_left_alone(text):
    assert as_text(text, "--system") == text == decode_bytes(text.encode("utf-8"), "x")


def test_json_escaped_lone_surrogate_is_replaced():
    assert as_text(json.loads('"a\\ud800b"'), "line 1") == "a\ufffd\ufffd\ufffdb"


def test_the_note_comes_once_per_source(capsys):
    as_text(os.fsdecode(STRAY), "--prompt")
    as_text(os.fsdecode(STRAY), "--prompt")
    decode_bytes(STRAY, "stdin")
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["note: --prompt holds bytes that are not UTF-8; each was replaced with U+FFFD",
                     "note: stdin holds bytes that are not UTF-8; each was replaced with U+FFFD"]


def test_replacement_characters_already_there_are_not_counted(capsys):
    assert decode_bytes("ok \ufffd".encode(), "stdin") == "ok \ufffd"
    assert capsys.readouterr().err == ""


def _cli(args: list, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], capture_output=True, input=stdin, timeout=300)


def _assert_replaced(result: subprocess.CompletedProcess, source: str) -> None:
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert f"note: {source} holds bytes that are not UTF-8" in stderr


def test_generate_prompt_with_stray_bytes(smollm2_path):
    result = _cli([b"generate", b"--target", os.fsencode(smollm2_path), b"--draft", b"none", b"--max-tokens", b"2",
                   b"--prompt", STRAY])
    _assert_replaced(result, "--prompt")


def test_generate_prompt_file_with_stray_bytes(smollm2_path, tmp_path):
    prompt_file = tmp_path / "latin1.txt"
    prompt_file.write_bytes(STRAY)
    result = _cli(["generate", "--target", str(smollm2_path), "--draft", "none", "--max-tokens", "2",
                   "--prompt-file", str(prompt_file)])
    _assert_replaced(result, f"--prompt-file {prompt_file}")


def test_generate_reads_the_prompt_from_stdin_with_prompt_file_dash(smollm2_path):
    """`--prompt-file -` reads stdin, as most tools do: the same greedy tokens as --prompt with that text."""
    common = ["generate", "--target", str(smollm2_path), "--draft", "none", "--max-tokens", "6", "--json"]
    piped = _cli([*common, "--prompt-file", "-"], stdin=b"The capital of France is")
    given = _cli([*common, "--prompt", "The capital of France is"])
    assert piped.returncode == 0 and given.returncode == 0, piped.stderr.decode()
    assert json.loads(piped.stdout)["tokens"] == json.loads(given.stdout)["tokens"]


def test_piped_chat_and_system_prompt_with_stray_bytes(smollm2_path, tmp_path):
    home = home_with_measurements(tmp_path / "home")
    env = {**os.environ, "POCKETSPEC_HOME": str(home)}
    result = subprocess.run([sys.executable, "-m", "apps.cli", "chat", "--target", str(smollm2_path), "--draft",
                             "none", "--max-tokens", "2", "--system", os.fsdecode(STRAY)],
                            capture_output=True, input=STRAY, timeout=300, env=env)
    _assert_replaced(result, "stdin")
    assert "note: --system holds bytes" in result.stderr.decode()
    transcript = next((home / "chats").glob("*.jsonl")).read_text(encoding="utf-8")
    assert "\ufffd" in transcript


def test_the_clis_first_imports_leave_the_runtime_unimported():
    """apps/cli.py imports this module before it can meet a Ctrl-C as `interrupted` (exit 130): through
    pocketspec.session_settings it imported numpy and the loader, a third of a second in which a Ctrl-C was a
    KeyboardInterrupt traceback."""
    code = ("import sys, click, apps.text_input, pocketspec.errors, pocketspec.signals; "
            "print(sorted(name for name in ('numpy', 'pocketspec.session_settings', 'pocketspec.settings') "
            "if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
