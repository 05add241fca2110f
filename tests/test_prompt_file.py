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
    ('{"prompt": "a", "max_tokens": 0}\n', ["line 1", "`max_tokens`", "from 1 to"]),
    ("\n\n", ["holds no prompts"]),
    ('{"prompt": "a", "max_token": 5}\n', ["line 1 has `max_token`, which --prompt-file does not read"]),
    ('{"prompt": "a", "temperature": 0.5}\n', ["line 1 has `temperature`", "`max_tokens`"]),
    ('{"prompt": "a", "turns": ["b"]}\n', ["line 1 has both `turns` and `prompt`"]),
    ('{"prompt": "a", "id": [1]}\n', ["line 1: `id` must be a string or a whole number, got a list"]),
    ('{"prompt": "a", "id": 1, "question_id": 2}\n', ["line 1 has both `question_id` and `id`"]),
    ('{"prompt": "a", "max_tokens": 100000000000}\n', ["line 1", "`max_tokens`", "from 1 to"]),
    ('{"prompt": "a", "max_tokens": "5"}\n', ['got "5"']),
    ('{"prompt": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n", ["line 1 nests its JSON too deeply"]),
    ('{"prompt": "a", "seed": ' + "1" * 5000 + "}\n", ["line 1 is not JSON Python can read"]),
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


def test_lines_end_only_at_line_breaks(tmp_path):
    """U+2028, U+2029 and U+0085 in a prompt (json.dumps(..., ensure_ascii=False) writes them raw) split its
    line in two, and a form feed on a line of its own moved every later line's number."""
    lines = _read(tmp_path, '{"prompt": "one\u2028two\u2029three\u0085four"}\r\n\x0c\n{"prompt": "b"}\r{"prompt": "c"}\n')
    assert [(line.line_number, line.text) for line in lines] == [
        (1, "one\u2028two\u2029three\u0085four"), (3, "b"), (4, "c")]


def test_ids_repeat_in_a_batch_and_a_line_without_one_is_known_by_its_line(tmp_path):
    """The same prompt sampled under several seeds keeps its id; an id-less line cannot take another's id."""
    lines = _read(tmp_path, '{"prompt": "a", "id": "3", "seed": 1}\n{"prompt": "a", "id": "3", "seed": 2}\n'
                            '{"prompt": "b"}\n{"prompt": "c", "id": null}\n{"prompt": "d", "id": 7}\n')
    assert [(line.given_id, line.prompt_id) for line in lines] == [
        ("3", "3"), ("3", "3"), (None, "line 3"), (None, "line 4"), (7, "7")]  # the output gives the id back as is

