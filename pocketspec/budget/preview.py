"""`pocketspec plan`'s answer, loading nothing: the plan for a pair, a budget and a context on this
device (or on described devices for a split), predicted with this machine's measured costs when
they are there."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes
from memplanner.memory_budget import is_split
from memplanner.split import plan_split
from pocketspec.backends.torch_open import check_self_draft
from pocketspec.budget.llama_plan import plan_on_device, workload_for
from pocketspec.budget.split_plan import plan_torch_split
from pocketspec.errors import BudgetError, UserError
from pocketspec.session_settings import SessionSettings, repack_allowed, settings_for
from pocketspec.settings import SELF_DRAFTS


@dataclass(frozen=True)
class PlanPreview:
    result: object  # memplanner's Plan, or SplitPlan (llama.cpp) or TorchSplitPlan (torch) when is_split
    title: str  # "plan for <pair>, max context N, budget B on <device>" (or split over <devices>)
    is_split: bool
    uses_measured_costs: bool  # speed from this machine's cost table, else from the reference tables
    notes: tuple[str, ...] = ()  # what the plan had to assume (a budget above what is free now)


def preview_plan(settings: SessionSettings) -> PlanPreview:
    """The plan `generate` runs on these settings: the same resolution of the flags (settings_for), the same
    split test, workload and planner call, with the device's free memory as the budget when none is given."""
    choice, target_settings, speculation = settings_for(settings)
    budget, max_context = settings.budget, target_settings.max_context
    is_split_run = is_split(target_settings.devices, budget)
    if is_split_run and budget is None:
        raise UserError("--devices needs --memory-budget: one size per device, e.g. 6GiB,4GiB")
    target_shape = shape_from_gguf(choice.target_path)
    draft_shape = shape_from_gguf(choice.draft_path) if choice.draft_path else None
    drafting = ("n-gram drafting" if choice.drafter == "ngram" else f"{choice.drafter} drafting"
                if choice.drafter in SELF_DRAFTS else "plain decoding")
    pair_name = target_shape.name + (f" + {draft_shape.name}" if draft_shape else f" ({drafting})")
    temperature, repack = settings.sampling.temperature, repack_allowed(settings.repack)
    if is_split_run and target_settings.backend == "torch":
        budgets = list(budget.per_device)
        target_settings = replace(target_settings, devices=tuple(device.name for device in budgets))
        if choice.drafter in SELF_DRAFTS:  # as generate refuses it before loading (a row split's, a small window)
            check_self_draft(choice.drafter, target_settings, speculation)
        result = plan_torch_split(choice, target_settings, speculation, budgets)
        title = (f"plan for {pair_name} on torch, max context {max_context}, {target_settings.split_mode} split over "
                 f"{', '.join(device.name for device in budgets)}")
        return PlanPreview(result, title, True, False)
    if is_split_run:
        budgets = budget.per_device
        workload = workload_for(choice, target_settings, speculation, settings.max_new_tokens, temperature)
        result = plan_split(list(budgets), target_shape, draft_shape, workload, alpha=speculation.expected_acceptance,
                            repack=repack)
        if not result.feasible:
            raise BudgetError(result.reason)
        title = (f"plan for {pair_name}, max context {max_context}, split over "
                 f"{', '.join(budget.name for budget in budgets)}")
        return PlanPreview(result, title, True, False)
    budget_bytes = None if budget is None else budget.total_bytes  # none given: what the device has free
    planned = plan_on_device(choice, budget_bytes, target_settings, speculation, settings.max_new_tokens, temperature,
                             repack)
    title = (f"plan for {pair_name}, max context {max_context}, budget {format_bytes(planned.budget_bytes)} "
             f"on {planned.device.name}")
    return PlanPreview(planned.plan, title, False, planned.uses_measured_costs, tuple(planned.notes))
