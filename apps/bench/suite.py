"""Benchmark suites (read by apps/prompt_file.py) and the prompts a bench takes from them.

Only the first turn is benchmarked: later turns of Spec-Bench/MT-Bench need the model's own
first answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from apps.prompt_file import DEFAULT_CATEGORY, read_prompt_rows
from pocketspec.errors import UserError

__all__ = ["DEFAULT_CATEGORY", "SuitePrompt", "read_suite", "select_prompts"]


@dataclass(frozen=True)
class SuitePrompt:
    prompt_id: str
    category: str
    text: str  # the first user turn


def read_suite(path: Path) -> list[SuitePrompt]:
    """Every prompt in the file, in order (its first turn); a bad file or line is one UserError naming both."""
    return [SuitePrompt(row.prompt_id, row.category, row.text) for row in read_prompt_rows(path, "--suite")]


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
