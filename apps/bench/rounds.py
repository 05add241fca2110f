"""The order `pocketspec bench` runs in: rounds that interleave the systems in time.

A round is one category's prompts (at most BenchSettings.max_prompts_per_round of them; a
suite without categories is cut into groups of that size). In each round plain decoding
runs first, because its rows are that round's reference, then every other system over the
same prompts, each in its own process, in an order that rotates from one repeat to the
next. When the machine's speed drifts (other work on a shared machine, heat), it moves all
the systems of a round alike, and every ratio compares rows measured in the same round. The price is one process start (imports, model load from
the page cache, warm-up) per system per round; each worker's is measured and reported.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Iterator

import click

from apps.bench.run import BenchJob, System, final_rows, run_system
from apps.bench.suite import SuitePrompt
from pocketspec.errors import UserError


@dataclass(frozen=True)
class Round:
    index: int
    label: str
    prompts: tuple[SuitePrompt, ...]
    repeat: int = 0  # which pass over the rounds (--repeats)


def plan_rounds(prompts: list[SuitePrompt], max_prompts_per_round: int, num_repeats: int = 1) -> list[Round]:
    """The conversations grouped by category (in the order categories first appear), each category
    cut into consecutive groups of at most max_prompts_per_round conversations; a conversation's
    turns stay together and in order, since a later turn follows plain decoding's earlier replies.
    With num_repeats > 1, every pass over those rounds is run again after the last one."""
    by_category: dict[str, dict[str, list[SuitePrompt]]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, {}).setdefault(prompt.conversation_id, []).append(prompt)
    rounds = []
    for category, conversations in by_category.items():
        group = list(conversations.values())
        chunks = [group[start:start + max_prompts_per_round] for start in range(0, len(group), max_prompts_per_round)]
        for number, chunk in enumerate(chunks, start=1):
            label = category if len(chunks) == 1 else f"{category} {number}/{len(chunks)}"
            rounds.append(Round(len(rounds), label, tuple(turn for conversation in chunk for turn in conversation)))
    if num_repeats == 1:
        return rounds
    return [Round(repeat * len(rounds) + round_.index, f"{round_.label}, repeat {repeat + 1}/{num_repeats}",
                  round_.prompts, repeat) for repeat in range(num_repeats) for round_ in rounds]


def schedule(rounds: list[Round], systems: list[System]) -> Iterator[tuple[Round, System]]:
    """Every (round, system) run in order: round after round; in each, plain first, then the
    other runnable systems in their given order, rotated by one place each repeat (--repeats): a
    system's place after plain (the page cache, the machine's drift over a round) then falls on every
    system alike, and the spread over the repeats shows it. Skipped systems never run."""
    runnable = [system for system in systems if system.status == "ok"]
    plain = [system for system in runnable if system.kind == "plain"]
    others = [system for system in runnable if system.kind != "plain"]
    for round_ in rounds:
        shift = round_.repeat % len(others) if others else 0
        for system in plain + others[shift:] + others[:shift]:
            yield round_, system


@dataclass
class BenchProgress:
    """What the rounds have measured so far; an interrupted bench writes it as it stands."""

    rounds: list[Round]
    rows: list[dict] = field(default_factory=list)  # the completed rounds' rows, each with its round index
    num_rounds_completed: int = 0
    wall_seconds: float = 0.0

    @property
    def is_partial(self) -> bool:
        return self.num_rounds_completed < len(self.rounds)

    def describe(self) -> dict:
        return {"num_planned": len(self.rounds), "num_completed": self.num_rounds_completed,
                "is_partial": self.is_partial, "wall_seconds": self.wall_seconds,
                "planned": [{"index": round_.index, "label": round_.label, "repeat": round_.repeat,
                             "prompt_ids": [prompt.prompt_id for prompt in round_.prompts]} for round_ in self.rounds]}


def run_rounds(systems: list[System], job: BenchJob, progress: BenchProgress) -> None:
    """Run the schedule with one progress bar (on stderr) over every prompt × system run.

    A system that fails gets status `failed` and a one-line reason; its rows of earlier
    rounds are dropped too (a system is compared over the same prompts as the others) and
    the others go on. Plain decoding failing is a UserError: nothing could be compared.
    """
    runs = list(schedule(progress.rounds, systems))
    width = max((len(_label(round_, system, len(progress.rounds))) for round_, system in runs), default=0)
    started = time.perf_counter()
    with click.progressbar(length=sum(len(round_.prompts) for round_, _ in runs), file=sys.stderr,
                           show_pos=True, label="starting".ljust(width)) as bar:
        try:
            for round_ in progress.rounds:
                round_systems = [system for run_round, system in runs if run_round is round_]
                _run_round(round_, round_systems, job, bar, width, progress)
        finally:
            progress.wall_seconds = time.perf_counter() - started


def _label(round_: Round, system: System, num_rounds: int) -> str:
    return f"{round_.label} ({round_.index + 1}/{num_rounds}): {system.name}"


def _run_round(round_: Round, systems: list[System], job: BenchJob, bar, width: int, progress: BenchProgress) -> None:
    reference: dict[str, dict] = {}
    round_rows: list[dict] = []
    for system in systems:
        if system.status != "ok":  # failed in an earlier round
            bar.update(len(round_.prompts))
            continue
        bar.label = _label(round_, system, len(progress.rounds)).ljust(width)  # the bar stays in place
        bar.render_progress()
        num_done = 0

        def advance() -> None:
            nonlocal num_done
            num_done += 1
            bar.update(1)

        raw_rows = run_system(system, job, list(round_.prompts), reference, advance)
        if system.status != "ok":
            system.reason = f"round {round_.label}: {system.reason}"
            if system.kind == "plain":
                raise UserError(f"plain decoding failed, so there is nothing to compare with: {system.reason}")
            click.echo(f"\n{system.name}: {system.status}: {system.reason}", err=True)
            bar.update(len(round_.prompts) - num_done)
            continue
        if system.kind == "plain":
            reference = {raw["prompt_id"]: raw for raw in raw_rows}
        round_rows += [{**row, "round": round_.index, "repeat": round_.repeat}
                       for row in final_rows(system, raw_rows, job, reference)]
    failed = {system.name for system in systems if system.status != "ok"}
    progress.rows = [row for row in progress.rows + round_rows if row["system"] not in failed]
    progress.num_rounds_completed += 1
