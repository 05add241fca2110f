"""Benchmark suites (read by apps/prompt_file.py) and the prompts a bench takes from them.

A conversation's later turns (MT-Bench's second questions, the code-edit suite's follow-up
edits) are benchmarked too, each after the model's own earlier replies: plain decoding
writes those replies, and every other system answers the very prompt plain decoding saw.
A later turn is reported in a category of its own ("coding (turn 2)").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from apps.prompt_file import DEFAULT_CATEGORY, read_prompt_rows
from pocketspec.errors import UserError

__all__ = ["DEFAULT_CATEGORY", "SuitePrompt", "read_suite", "select_prompts", "with_later_turns"]


@dataclass(frozen=True)
class SuitePrompt:
    prompt_id: str
    category: str
    text: str  # this turn's user message
    turn: int = 1
    conversation: str | None = None  # a later turn: the prompt_id of its conversation's first turn
    later_turns: tuple[str, ...] = ()  # a first turn: the user messages that follow it

    @property
    def conversation_id(self) -> str:
        return self.conversation or self.prompt_id

    @property
    def report_category(self) -> str:
        return self.category if self.turn == 1 else f"{self.category} (turn {self.turn})"


def read_suite(path: Path) -> list[SuitePrompt]:
    """Every conversation in the file, in order, as its first turn; a bad file or line is one UserError naming both.
    Ids are unique; every system runs every prompt with the bench's --max-tokens and --seed, so a line's own are
    refused."""
    rows, line_by_id = read_prompt_rows(path, "--suite"), {}
    for row in rows:
        # each system's results are matched to plain decoding's by id, a later turn's by ID/turnN
        later_ids = [later_turn_id(row.prompt_id, turn) for turn in range(2, len(row.turns) + 1)]
        for prompt_id in [row.prompt_id, *later_ids]:
            if prompt_id in line_by_id:
                raise UserError(f"--suite {path} line {row.line_number}'s id {prompt_id!r} is also line "
                                f"{line_by_id[prompt_id]}'s: give each prompt its own id")
            line_by_id[prompt_id] = row.line_number
        own = [key for key, value in (("max_tokens", row.max_tokens), ("seed", row.seed)) if value is not None]
        if own:
            raise UserError(f"--suite {path} line {row.line_number} sets {' and '.join(own)}: bench runs every "
                            "prompt with its own --max-tokens and --seed; leave them out of the suite")
    return [SuitePrompt(row.prompt_id, row.category, row.text, later_turns=row.turns[1:]) for row in rows]


def later_turn_id(prompt_id: str, turn: int) -> str:
    return f"{prompt_id}/turn{turn}"


def with_later_turns(prompts: list[SuitePrompt], max_turns: int | None = None) -> list[SuitePrompt]:
    """Each first turn followed by its conversation's later turns (up to max_turns in all; None: every one)."""
    found = []
    for prompt in prompts:
        found.append(prompt)
        for turn, text in enumerate(prompt.later_turns[:None if max_turns is None else max_turns - 1], start=2):
            found.append(SuitePrompt(later_turn_id(prompt.prompt_id, turn), prompt.category, text, turn,
                                     prompt.prompt_id))
    return found


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
