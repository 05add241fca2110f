"""The one result of `--memory-budget`, whatever planned it: llama.cpp's planner, the torch
backend's exact sizes, a split over several devices or a batch's rows.

Every front end (generate, chat's /budget, bench, the server) shows it the same way:
MemoryPlan.describe(). The line "predicted peak … of … (parts)" is written here only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memplanner.sizes import format_bytes, kept_free_text
from pocketspec.loader import ModelChoice
from pocketspec.settings import BatchSettings, ModelSettings, SpeculationSettings


@dataclass
class MemoryPlan:
    """The runtime settings a budget sized, and the lines that show what it decided."""

    choice: ModelChoice
    target_settings: ModelSettings
    speculation: SpeculationSettings
    budget_bytes: int | None = None  # all devices together; None: a split without a budget (an even split)
    lines: list[str] = field(default_factory=list)
    draft_max_context: int | None = None  # the draft model's window, when the plan shortened it
    draft_device: str | None = None  # where a split places the draft model
    batch: BatchSettings | None = None  # a batch plan's rows
    predicted_peak_bytes: int | None = None
    planner_result: object = None  # memplanner's own result (Plan, SplitPlan, BatchPlan) for tests and benchmarks
    shown_after_loading: bool = False  # a split's lines come once its devices have loaded: a load error stays one line

    def describe(self) -> str:
        return "\n".join(self.lines)


def sizes_text(terms: dict[str, int]) -> str:
    """"weights 1.2 GiB, KV cache 56 MiB, ..." """
    return ", ".join(f"{name} {format_bytes(size)}" for name, size in terms.items())


def peak_line(scope: str, peak_bytes: int, budget_bytes: int, details: str, kept_free_bytes: int = 0) -> str:
    """The plan's headline: `memory plan (scope): predicted peak P [+ R kept free] of B (details)`."""
    scope_text = f" ({scope})" if scope else ""
    return (f"memory plan{scope_text}: predicted peak {format_bytes(peak_bytes)}{kept_free_text(kept_free_bytes)} of "
            f"{format_bytes(budget_bytes)} ({details})")


# The shortest context the lightest settings a refusal names keep: a prompt and its reply
LIGHTEST_CONTEXT = 512


def lighter_advice(advice: str, lightest_flags: str, lightest_bytes: int, budget_bytes: int) -> str:
    """What a refusal suggests: `advice` (lighter settings to try) with what the lightest of them all need,
    or, where the budget is below even that, only the budget they need."""
    if budget_bytes < lightest_bytes:
        return f"even {lightest_flags} need {format_bytes(lightest_bytes)}: raise --memory-budget"
    return f"{advice} (the lightest, {lightest_flags}, need {format_bytes(lightest_bytes)})"
