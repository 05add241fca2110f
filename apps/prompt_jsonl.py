"""Reading `--prompt-file` as JSONL for `--batch`: one request per line, errors that name the line.

A line is an object with `prompt` (a string), or `turns` (a list of strings, as in
Spec-Bench and MT-Bench) holding exactly one turn: a later turn follows the model's
reply to the earlier one, which is a chat, not a batch. Optional: `seed` (an integer;
default --seed plus the line's index among the prompts) and `max_tokens` (an integer
of at least 1; default --max-tokens). Blank lines are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from apps.jsonl_objects import read_jsonl_objects
from apps.text_input import as_text
from pocketspec.errors import UserError

_SHAPE = 'give {"prompt": "..."} or {"turns": ["..."]}, one object per line'


@dataclass(frozen=True)
class PromptLine:
    line_number: int
    text: str
    seed: int | None = None
    max_tokens: int | None = None


def _text(row: dict, where: str) -> str:
    if "prompt" in row:
        text = row["prompt"]
    elif "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise UserError(f"{where}: `turns` must be a list holding one string")
        if len(turns) > 1:
            raise UserError(f"{where} has {len(turns)} turns: --batch decodes one-turn prompts (a later turn "
                            "follows the model's reply to the earlier one); keep the first turn only")
        text = turns[0]
    else:
        raise UserError(f"{where}: {_SHAPE}")
    if not isinstance(text, str):
        raise UserError(f"{where}: the prompt must be a string, got {type(text).__name__}")
    if not text.strip():
        raise UserError(f"{where}: the prompt is empty")
    return as_text(text, where)


def _whole_number(row: dict, key: str, where: str, minimum: int | None) -> int | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" of at least {minimum}" if minimum is not None else ""
        raise UserError(f"{where}: `{key}` must be a whole number{bound}, got {value!r}")
    return value


def read_prompt_lines(path: Path) -> list[PromptLine]:
    prompts = [PromptLine(line_number, _text(row, where), _whole_number(row, "seed", where, None),
                          _whole_number(row, "max_tokens", where, 1))
               for line_number, row, where in read_jsonl_objects(path, "--prompt-file", _SHAPE)]
    if not prompts:
        raise UserError(f"--prompt-file {path} holds no prompts: write one JSON object per line")
    return prompts
