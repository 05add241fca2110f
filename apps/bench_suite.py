"""Benchmark suites: any JSONL whose rows have `turns` (a list of user turns) or `prompt` (a string).

`category` and an id (`question_id` or `id`) are optional. Only the first turn is
benchmarked: later turns of Spec-Bench/MT-Bench need the model's own first answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from apps.jsonl_objects import read_jsonl_objects
from apps.text_input import as_text
from pocketspec.errors import UserError

DEFAULT_CATEGORY = "uncategorized"
_SHAPE = "give `turns` (a list of strings) or `prompt` (a string), one object per line"


@dataclass(frozen=True)
class SuitePrompt:
    prompt_id: str
    category: str
    text: str  # the first user turn


def _prompt_text(row: dict, where: str) -> str:
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise UserError(f"{where}: `turns` must be a list whose first item is a non-empty string")
        return turns[0]
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise UserError(f"{where}: `prompt` must be a non-empty string")
        return row["prompt"]
    raise UserError(f"{where} has neither `turns` (a list) nor `prompt` (a string)")


def read_suite(path: Path) -> list[SuitePrompt]:
    """Every prompt in the file, in order; a bad file or line is one UserError naming both."""
    prompts = []
    for line_number, row, where in read_jsonl_objects(path, "--suite", _SHAPE):
        prompt_id = row.get("question_id", row.get("id", line_number))
        prompts.append(SuitePrompt(str(prompt_id), str(row.get("category") or DEFAULT_CATEGORY),
                                   as_text(_prompt_text(row, where), where)))
    if not prompts:
        raise UserError(f"--suite {path} holds no prompts")
    return prompts


def select_prompts(prompts: list[SuitePrompt], categories: tuple[str, ...], per_category: int) -> list[SuitePrompt]:
    """The first `per_category` prompts of each chosen category (all categories when none are named)."""
    known = list(dict.fromkeys(prompt.category for prompt in prompts))
    unknown = [category for category in categories if category not in known]
    if unknown:
        raise UserError(f"--categories {','.join(unknown)}: not in the suite, which has {', '.join(known)}")
    chosen: dict[str, list[SuitePrompt]] = defaultdict(list)
    for prompt in prompts:
        if (not categories or prompt.category in categories) and len(chosen[prompt.category]) < per_category:
            chosen[prompt.category].append(prompt)
    return [prompt for group in chosen.values() for prompt in group]
