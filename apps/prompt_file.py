"""The one reader of prompt files: JSONL, one object per line, for `generate --batch --prompt-file`,
`bench --suite` and the benchmark scripts. Errors name the flag, the file and the line.

A line holds `prompt` (a string) or `turns` (a list of user turns, as in Spec-Bench and
MT-Bench). Optional: `category`, an id (`question_id` or `id`), `seed` (as --seed's, without -1) and
`max_tokens` (at least 1). Blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from apps.text_input import as_text, read_text_file
from pocketspec.errors import UserError
from pocketspec.setting_ranges import setting_range
from pocketspec.settings import SamplingSettings

DEFAULT_CATEGORY = "uncategorized"
BATCH_SHAPE = 'give {"prompt": "..."} or {"turns": ["..."]}, one object per line'
SUITE_SHAPE = "give `turns` (a list of strings) or `prompt` (a string), one object per line"
PROMPT_FILE_MAX_BYTES = 256 * 2**20  # a file of prompts past this is refused unread (`--prompt-file /dev/zero`)


@dataclass(frozen=True)
class PromptRow:
    line_number: int
    prompt_id: str  # question_id, id, else the line number
    category: str
    turns: tuple[str, ...]  # the user turns; `prompt` is one turn
    seed: int | None = None
    max_tokens: int | None = None

    @property
    def text(self) -> str:
        """The first user turn: later turns follow the model's own reply to it."""
        return self.turns[0]


def read_jsonl_objects(path: Path, flag: str, shape_hint: str) -> Iterator[tuple[int, dict, str]]:
    """(line number, object, "FLAG PATH line N") for every non-blank line; `shape_hint` ends the error
    for a line that is not JSON or not an object."""
    lines = read_text_file(path, flag, PROMPT_FILE_MAX_BYTES, why="more than one run reads: split it").splitlines()
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{flag} {path} line {line_number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{where} is not JSON ({error.msg}); {shape_hint}") from None
        if not isinstance(row, dict):
            raise UserError(f"{where} is not a JSON object; {shape_hint}")
        yield line_number, row, where


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words: null, true, a number, a list, an object."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {int: "a number", float: "a number", list: "a list", dict: "an object"}.get(type(value), "a string")


def _turns(row: dict, where: str, shape_hint: str) -> tuple[str, ...]:
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(turn, str) for turn in turns):
            raise UserError(f"{where}: `turns` must be a list holding at least one string")
        key, text = "turns", turns[0]
    elif "prompt" in row:
        text = row["prompt"]
        if not isinstance(text, str):
            raise UserError(f"{where}: the prompt must be a string, got {_json_kind(text)}")
        key, turns = "prompt", [text]
    else:
        raise UserError(f"{where} has neither `turns` (a list) nor `prompt` (a string); {shape_hint}")
    if not text.strip():
        raise UserError(f"{where}: `{key}` must be a non-empty string" + (" first" if key == "turns" else ""))
    return tuple(as_text(turn, where) for turn in turns)


def _whole_number(row: dict, key: str, where: str, minimum: int, maximum: int | None = None) -> int | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        bound = f" of at least {minimum}" if maximum is None else f" from {minimum} to {maximum}"
        raise UserError(f"{where}: `{key}` must be a whole number{bound}, got {value!r}")
    return value


def _seed(row: dict, where: str) -> int | None:
    """A row's own seed: --seed's range, without -1 (a row's seed is there to fix its draws)."""
    seed_range = setting_range(SamplingSettings, "seed")
    return _whole_number(row, "seed", where, int(seed_range.low), int(seed_range.high))


def read_prompt_rows(path: Path, flag: str, shape_hint: str = SUITE_SHAPE) -> list[PromptRow]:
    """Every prompt in the file, in order; a bad file or line is one UserError naming both."""
    rows, line_by_id = [], {}
    for line_number, row, where in read_jsonl_objects(path, flag, shape_hint):
        prompt_id = str(row.get("question_id", row.get("id", line_number)))
        if prompt_id in line_by_id:  # results are matched to their prompt by id
            raise UserError(f"{where} has the id {prompt_id!r} of line {line_by_id[prompt_id]} (a line without "
                            "`question_id` or `id` is known by its line number); give each prompt its own id")
        line_by_id[prompt_id] = line_number
        rows.append(PromptRow(line_number, prompt_id, str(row.get("category") or DEFAULT_CATEGORY),
                              _turns(row, where, shape_hint), _seed(row, where),
                              _whole_number(row, "max_tokens", where, 1)))
    if not rows:
        raise UserError(f"{flag} {path} holds no prompts: write one JSON object per line")
    return rows


def read_batch_prompts(path: Path) -> list[PromptRow]:
    """--prompt-file for --batch: one-turn prompts only (a later turn follows the model's reply to the
    earlier one, which is a chat, not a batch)."""
    rows = read_prompt_rows(path, "--prompt-file", BATCH_SHAPE)
    for row in rows:
        if len(row.turns) > 1:
            raise UserError(f"--prompt-file {path} line {row.line_number} has {len(row.turns)} turns: --batch "
                            "decodes one-turn prompts (a later turn follows the model's reply to the earlier "
                            "one); keep the first turn only")
    return rows
