"""`--memory-budget` for several sequences of one llama.cpp context (a server's concurrent requests).

The planner sizes a context of num_sequences times the context asked for: the KV cache is the
same bytes whether one sequence or several hold the tokens (a stream each, of an equal share).
What several sequences add are logits rows: llama.cpp's output buffer holds every sequence's
verify rows, and each round hands every sequence a copy of its own. On one device the planner
counts them for every configuration it weighs (memplanner's `sequences_logits` term); a plan split
over devices is planned for one sequence, and per_sequence_plan adds them to its predicted peak where
it has one.
"""

from __future__ import annotations

from dataclasses import replace

from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes
from memplanner.terms import sequences_logits_bytes
from pocketspec.budget.memory_plan import MemoryPlan
from pocketspec.errors import BudgetError


def sequences_rows_bytes(target_path, num_sequences: int, rows: int) -> int:
    """What num_sequences' logits rows (`rows` each) add to one sequence's plan (memplanner.terms)."""
    return sequences_logits_bytes(shape_from_gguf(target_path), num_sequences, rows)


def per_sequence_plan(plan: MemoryPlan, num_sequences: int, count_flag: str = "--max-concurrency") -> MemoryPlan:
    """The plan made for num_sequences x the context, as each sequence's settings; UserError, naming
    count_flag (the flag that asked for the sequences), when their logits rows do not fit beside it."""
    if num_sequences == 1:
        return plan
    context = plan.target_settings.max_context // num_sequences
    draft_context = plan.draft_max_context // num_sequences if plan.draft_max_context else None
    shared = f"memory plan: {num_sequences} sequences of {context} tokens share the context; their logits rows"
    planned_rows_bytes = plan.planner_result.terms.get("sequences_logits", 0) if plan.planner_result else 0
    if planned_rows_bytes:  # in the predicted peak already
        line = f"{shared}, {format_bytes(planned_rows_bytes)}, are in the predicted peak"
        peak_bytes = plan.predicted_peak_bytes
    else:
        added_bytes = sequences_rows_bytes(plan.choice.target_path, num_sequences, plan.target_settings.max_logits_rows)
        peak_bytes = (plan.predicted_peak_bytes or 0) + added_bytes
        line = f"{shared} add {format_bytes(added_bytes)}, predicted peak {format_bytes(peak_bytes)}"
        if plan.budget_bytes is not None and peak_bytes > plan.budget_bytes:
            raise BudgetError(f"{count_flag} {num_sequences} does not fit --memory-budget "
                              f"{format_bytes(plan.budget_bytes)}: {num_sequences} sequences' logits rows add "
                              f"{format_bytes(added_bytes)} to a predicted "
                              f"{format_bytes(plan.predicted_peak_bytes or 0)}; lower {count_flag} or --max-context, "
                              "or raise the budget")
    return replace(plan, target_settings=replace(plan.target_settings, max_context=context),
                   draft_max_context=draft_context, lines=[*plan.lines, line], predicted_peak_bytes=peak_bytes)
