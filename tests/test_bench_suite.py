"""Reading benchmark suites: `turns` or `prompt` rows, optional category and id, and bad
files reported as one UserError naming the file and the line."""

from __future__ import annotations

import json

import pytest

from apps.bench.command import DEFAULT_SUITE
from apps.bench.suite import DEFAULT_CATEGORY, SuitePrompt, read_suite, select_prompts, with_later_turns
from pocketspec.errors import UserError


def write_lines(tmp_path, *lines: str):
    path = tmp_path / "suite.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_turns_and_prompt_rows_with_optional_fields(tmp_path):
    path = write_lines(tmp_path,
                       json.dumps({"question_id": 7, "category": "coding", "turns": ["first", "second"]}),
                       "",
                       json.dumps({"id": "x1", "prompt": "a prompt"}),
                       json.dumps({"prompt": "no id"}))
    assert read_suite(path) == [SuitePrompt("7", "coding", "first", later_turns=("second",)),
                                SuitePrompt("x1", DEFAULT_CATEGORY, "a prompt"),
                                SuitePrompt("line 4", DEFAULT_CATEGORY, "no id")]  # the line number stands in


def test_later_turns_follow_their_first_turn_in_a_category_of_their_own(tmp_path):
    path = write_lines(tmp_path, json.dumps({"question_id": 7, "category": "coding", "turns": ["a", "b", "c"]}),
                       json.dumps({"id": "x1", "prompt": "alone"}))
    units = with_later_turns(read_suite(path))
    assert [(unit.prompt_id, unit.text, unit.turn, unit.conversation_id, unit.report_category) for unit in units] == [
        ("7", "a", 1, "7", "coding"), ("7/turn2", "b", 2, "7", "coding (turn 2)"),
        ("7/turn3", "c", 3, "7", "coding (turn 3)"), ("x1", "alone", 1, "x1", DEFAULT_CATEGORY)]
    assert [unit.prompt_id for unit in with_later_turns(read_suite(path), max_turns=2)] == ["7", "7/turn2", "x1"]
    assert [unit.prompt_id for unit in with_later_turns(read_suite(path), max_turns=1)] == ["7", "x1"]


@pytest.mark.parametrize("line, fragment", [
    ("{not json", "line 2 is not JSON"),
    (json.dumps({"question": "neither"}), "line 2 has neither `turns` (a list) nor `prompt`"),
    (json.dumps(["a", "list"]), "line 2 is not a JSON object"),
    (json.dumps({"turns": "not a list"}), "line 2: `turns` must be a list"),
    (json.dumps({"turns": []}), "line 2: `turns` must be a list"),
    (json.dumps({"prompt": "  "}), "line 2: `prompt` must be a non-empty string"),
    # results are matched to prompts by id: the second run under one id was compared with the first
    (json.dumps({"question_id": 1, "prompt": "again"}), "line 2's id '1' is also line 1's"),
    (json.dumps({"id": "1", "prompt": "again"}), "line 2's id '1' is also line 1's"),
    (json.dumps({"id": "1/turn2", "prompt": "a later turn's id"}), "line 2's id '1/turn2' is also line 1's"),
    (json.dumps({"prompt": "own limit", "max_tokens": 5}), "line 2 sets max_tokens: bench runs every prompt"),
    (json.dumps({"prompt": "own draws", "seed": 5}), "line 2 sets seed: bench runs every prompt"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, line, fragment):
    path = write_lines(tmp_path, json.dumps({"question_id": 1, "turns": ["fine", "then"]}), line)
    with pytest.raises(UserError) as error:
        read_suite(path)
    assert str(path) in str(error.value) and fragment in str(error.value)


def test_missing_empty_and_binary_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_suite(tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="holds no prompts"):
        read_suite(write_lines(tmp_path, "", ""))
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="line 1 is not JSON"):  # its bytes read as U+FFFD, as every text input's
        read_suite(binary)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"prompt": "caf\xe9"}\n')
    assert read_suite(latin1)[0].text == "caf\ufffd"


def test_select_per_category_in_suite_order():
    prompts = [SuitePrompt(str(i), category, f"p{i}") for i, category in enumerate("aabbbc")]
    assert [p.prompt_id for p in select_prompts(prompts, (), 2)] == ["0", "1", "2", "3", "5"]
    assert [p.prompt_id for p in select_prompts(prompts, ("b", "c"), 1)] == ["2", "5"]
    with pytest.raises(UserError, match="--categories z: not in the suite, which has a, b, c"):
        select_prompts(prompts, ("z",), 1)


def test_shipped_spec_bench_reads():
    prompts = read_suite(DEFAULT_SUITE)
    assert len(prompts) == 320
    assert {"coding", "summarization", "translation", "math_reasoning"} <= {prompt.category for prompt in prompts}
