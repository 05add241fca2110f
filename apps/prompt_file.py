"""The one reader of prompt files: JSONL, one object per line, for `generate --batch --prompt-file`,
`bench --suite` and the benchmark scripts. Errors name the flag, the file and the line.

A line holds `prompt` (a string) or `turns` (a list of user turns, as in Spec-Bench and
MT-Bench), not both. Optional: `category`, an id (`question_id` or `id`: a string or a whole number),
`seed` (as --seed's, without -1) and `max_tokens` (as --max-tokens'). A --batch file holds no
other key; a suite may (one from elsewhere holds its own). Blank lines are skipped; lines end at
\n, \r\n or \r only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from apps.text_input import as_text, read_text_file
from pocketspec.errors import UserError
from pocketspec.setting_ranges import setting_range
from pocketspec.settings import GenerationSettings, SamplingSettings

DEFAULT_CATEGORY = "uncategorized"
BATCH_SHAPE = 'give {"prompt": "..."} or {"turns": ["..."]}, one object per line'
SUITE_SHAPE = "give `turns` (a list of strings) or `prompt` (a string), one object per line"
ID_KEYS = ("question_id", "id")
BATCH_KEYS = {"prompt", "turns", *ID_KEYS, "category", "seed", "max_tokens"}
LINE_BREAK = re.compile(r"\r\n|\r|\n")
PROMPT_FILE_MAX_BYTES = 256 * 2**20  # a file of prompts past this is refused unread (`--prompt-file /dev/zero`)


@dataclass(frozen=True)
class PromptRow:
    line_number: int
    given_id: str | int | None  # question_id or id, as the line has it; None without one
    category: str
    turns: tuple[str, ...]  # the user turns; `prompt` is one turn
    seed: int | None = None
    max_tokens: int | None = None

    @property
    def prompt_id(self) -> str:
        """The given id as text, else "line N" from the line's number (which no number can be)."""
        return str(self.given_id) if self.given_id is not None else f"line {self.line_number}"

    @property
    def text(self) -> str:
        """The first user turn: later turns follow the model's own reply to it."""
        return self.turns[0]


def read_jsonl_objects(path: Path, flag: str, shape_hint: str) -> Iterator[tuple[int, dict, str]]:
    """(line number, object, "FLAG PATH line N") for every non-blank line; `shape_hint` ends the error
    for a line that is not JSON or not an object."""
    text = read_text_file(path, flag, PROMPT_FILE_MAX_BYTES, why="more than one run reads: split it")
    # lines end at \n, \r\n or \r only: str.splitlines() also ends them at U+2028, U+0085 or a form feed, which
    # JSON strings hold unescaped (json.dumps(..., ensure_ascii=False) writes them so)
    for line_number, line in enumerate(LINE_BREAK.split(text), start=1):
        if not line.strip():
            continue
        where = f"{flag} {path} line {line_number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{where} is not JSON ({error.msg}); {shape_hint}") from None
        except ValueError as error:  # a number of more digits than Python converts
            raise UserError(f"{where} is not JSON Python can read ({error}); {shape_hint}") from None
        except RecursionError:
            raise UserError(f"{where} nests its JSON too deeply to read; {shape_hint}") from None
        if not isinstance(row, dict):
            raise UserError(f"{where} is not a JSON object; {shape_hint}")
        yield line_number, row, where


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words: null, true, a number, a list, an object."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {int: "a number", float: "a number", list: "a list", dict: "an object"}.get(type(value), "a string")


def _turns(row: dict, where: str, shape_hint: str) -> tuple[str, ...]:
    if "turns" in row and "prompt" in row:
        raise UserError(f"{where} has both `turns` and `prompt`: keep one")
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
        raise UserError(f"{where}: `{key}` must be a whole number{bound}, got {json.dumps(value)}")
    return value


def _given_id(row: dict, where: str) -> str | int | None:
    keys = [key for key in ID_KEYS if row.get(key) is not None]
    if len(keys) > 1:
        raise UserError(f"{where} has both `question_id` and `id`: keep one")
    if not keys:
        return None
    value = row[keys[0]]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise UserError(f"{where}: `{keys[0]}` must be a string or a whole number, got {_json_kind(value)}")
    return value


def _max_tokens(row: dict, where: str) -> int | None:
    """A row's own token limit: --max-tokens' range."""
    limit = setting_range(GenerationSettings, "max_new_tokens")
    return _whole_number(row, "max_tokens", where, int(limit.low), int(limit.high))


def _seed(row: dict, where: str) -> int | None:
    """A row's own seed: --seed's range, without -1 (a row's seed is there to fix its draws)."""
    seed_range = setting_range(SamplingSettings, "seed")
    return _whole_number(row, "seed", where, int(seed_range.low), int(seed_range.high))


def read_prompt_rows(path: Path, flag: str, shape_hint: str = SUITE_SHAPE,
                     known_keys: set[str] | None = None) -> list[PromptRow]:
    """Every prompt in the file, in order; a bad file or line is one UserError naming both. known_keys: the only
    keys a line may hold (None: any, as a suite from elsewhere holds its own)."""
    rows = []
    for line_number, row, where in read_jsonl_objects(path, flag, shape_hint):
        turns = _turns(row, where, shape_hint)  # a line without a prompt is told so first
        unknown = sorted(set(row) - known_keys) if known_keys is not None else []
        if unknown:  # a misspelt `max_token`, or a `temperature` no line can set, would go unheeded
            raise UserError(f"{where} has {', '.join(f'`{key}`' for key in unknown)}, which {flag} does not read: "
                            f"a line holds {', '.join(f'`{key}`' for key in sorted(known_keys))}")
        rows.append(PromptRow(line_number, _given_id(row, where), str(row.get("category") or DEFAULT_CATEGORY),
                              turns, _seed(row, where), _max_tokens(row, where)))
    if not rows:
        raise UserError(f"{flag} {path} holds no prompts: write one JSON object per line")
    return rows


def read_batch_prompts(path: Path) -> list[PromptRow]:
    """--prompt-file for --batch: one-turn prompts only (a later turn follows the model's reply to the
    earlier one, which is a chat, not a batch)."""
    rows = read_prompt_rows(path, "--prompt-file", BATCH_SHAPE, known_keys=BATCH_KEYS)
    for row in rows:
        if len(row.turns) > 1:
            raise UserError(f"--prompt-file {path} line {row.line_number} has {len(row.turns)} turns: --batch "
                            "decodes one-turn prompts (a later turn follows the model's reply to the earlier "
                            "one); keep the first turn only")
    return rows
