"""Reading a JSONL prompt file for --batch: what is accepted, and errors that name the line."""

from __future__ import annotations

import codecs

import pytest

from apps.prompt_file import PromptRow, read_batch_prompts
from pocketspec.errors import UserError


def _read(tmp_path, text: str) -> list[PromptRow]:
    path = tmp_path / "prompts.jsonl"
    path.write_text(text, encoding="utf-8")
    return read_batch_prompts(path)


def test_prompts_turns_seeds_and_blank_lines(tmp_path):
    text = '{"prompt": "one"}\n\n{"turns": ["two"], "seed": 7}\n{"prompt": "three", "max_tokens": 5}\n'
    lines = _read(tmp_path, text)
    assert [(line.line_number, line.text, line.seed, line.max_tokens) for line in lines] == [
        (1, "one", None, None), (3, "two", 7, None), (4, "three", None, 5)]


@pytest.mark.parametrize("text, fragments", [
    ('{"prompt": "ok"}\nnot json\n', ["line 2 is not JSON"]),
    ('{"prompt": "ok"}\n{"prompt": "  "}\n', ["line 2", "empty"]),
    ('["a list"]\n', ["line 1", '{"prompt": "..."}']),
    ('{"text": "no prompt key"}\n', ["line 1", '{"prompt": "..."}']),
    ('{"prompt": 3}\n', ["line 1", "must be a string, got a number"]),
    ('{"prompt": null}\n', ["line 1", "must be a string, got null"]),
    ('{"turns": ["first", "second"]}\n', ["line 1 has 2 turns", "first turn only"]),
    ('{"turns": []}\n', ["line 1", "one string"]),
    ('{"prompt": "a", "seed": "x"}\n', ["line 1", "`seed`"]),
    ('{"prompt": "a", "seed": -5}\n', ["line 1", "`seed`", "from 0 to"]),
    ('{"prompt": "a", "seed": 9223372036854775808}\n', ["line 1", "`seed`", "from 0 to"]),
    ('{"prompt": "a", "max_tokens": 0}\n', ["line 1", "`max_tokens`", "at least 1"]),
    ("\n\n", ["holds no prompts"]),
    ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', ["line 2 has the id 'a' of line 1"]),
    ('{"prompt": "x"}\n{"id": 1, "prompt": "y"}\n', ["line 2 has the id '1' of line 1", "line number"]),
])
def test_bad_lines_are_named(tmp_path, text, fragments):
    with pytest.raises(UserError) as error:
        _read(tmp_path, text)
    for fragment in fragments:
        assert fragment in str(error.value)


def test_a_missing_file(tmp_path):
    with pytest.raises(UserError, match="--prompt-file .* does not exist"):
        read_batch_prompts(tmp_path / "nope.jsonl")


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    """Windows Notepad starts a UTF-8 file with one."""
    path = tmp_path / "notepad.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + '{"prompt": "one"}\r\n{"prompt": "two"}\r\n'.encode())
    assert [line.text for line in read_batch_prompts(path)] == ["one", "two"]
