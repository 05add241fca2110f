"""`--devices` and per-device `--memory-budget`: the split each backend loads, from the per-device plan.

llama.cpp: memplanner.split.plan_split (llama.cpp's buffers) picks the configuration, each
device's blocks and the draft's device; tensor_split, main_gpu and split_mode follow from them
(pocketspec/backends/llama_split.py). torch: memplanner.torch_split counts each device's exact
tensor bytes and assigns the blocks (layer split), or checks every rank's slice (row split).
Without a budget the blocks are split evenly. Each device's share is announced as a note.
"""

from __future__ import annotations

from dataclasses import replace

from memplanner.planner import REPACK_EITHER
from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes
from memplanner.memory_budget import MemoryBudget
from memplanner.split import DeviceBudget, layer_counts, plan_split
from pocketspec.backends.device_check import check_devices
from pocketspec.budget.llama_plan import settings_from_plan, workload_for
from pocketspec.budget.memory_plan import MemoryPlan, sizes_text
from pocketspec.errors import BudgetError
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings


def _share_note(device: str, first: int, count: int, terms: dict[str, int], budget_bytes: int | None) -> str:
    blocks = f"target blocks {first}-{first + count - 1}" if count else "no target blocks"
    parts = sizes_text(terms)
    of_budget = f" of {format_bytes(budget_bytes)}" if budget_bytes is not None else ""
    return f"memory plan {device}: {blocks}; {parts} = {format_bytes(sum(terms.values()))}{of_budget}"


def plan_torch_split(choice: ModelChoice, target_settings: ModelSettings, speculation: SpeculationSettings,
                     budgets: list[DeviceBudget]):
    """memplanner.torch_split's plan (TorchSplitPlan) of a torch target over the budgets' devices, by layers or
    by rows as target_settings.split_mode says, each process's own terms counted; refused when it does not fit."""
    from pocketspec.budget.torch_plan import torch_layout
    from memplanner.torch_split import plan_layer_split, plan_row_split

    shape, layout = torch_layout(choice, target_settings, speculation)
    plan_for_mode = plan_row_split if target_settings.split_mode == "row" else plan_layer_split
    found = plan_for_mode(budgets, shape, layout, counts_process=True)
    if not found.feasible:
        raise BudgetError(found.reason)
    return found


def _torch_split(applied: MemoryPlan, budgets: list[DeviceBudget]) -> MemoryPlan:
    is_row = applied.target_settings.split_mode == "row"
    found = plan_torch_split(applied.choice, applied.target_settings, applied.speculation, budgets)
    applied.lines = [_share_note(share.device, share.first_layer, share.num_layers, share.terms, share.budget_bytes)
                     for share in found.shares]
    applied.planner_result = found
    if not is_row:
        applied.target_settings = replace(applied.target_settings, layers_per_device=found.layers_per_device)
    return applied


def _llama_split(applied: MemoryPlan, budgets: list[DeviceBudget], max_new_tokens: int, temperature: float,
                 repack: tuple[bool, ...]) -> MemoryPlan:
    choice = applied.choice
    target_shape = shape_from_gguf(choice.target_path)
    draft_shape = shape_from_gguf(choice.draft_path) if choice.draft_path is not None else None
    workload = workload_for(choice, applied.target_settings, applied.speculation, max_new_tokens, temperature)
    found = plan_split(budgets, target_shape, draft_shape, workload, alpha=applied.speculation.expected_acceptance,
                       repack=repack)
    if not found.feasible:
        without_draft = ", or pass --draft ngram" if draft_shape is not None and workload.plans_draft_model_only else ""
        raise BudgetError(found.reason + without_draft)
    applied.choice, target_settings, applied.speculation, applied.draft_max_context = settings_from_plan(
        found.settings, choice, applied.target_settings, applied.speculation)
    applied.target_settings = replace(target_settings, devices=tuple(share.device for share in found.shares),
                                      layers_per_device=tuple(share.num_layers for share in found.shares))
    applied.planner_result = found
    applied.draft_device = found.draft_device if applied.choice.draft_path is not None else None
    applied.lines = [_share_note(share.device, share.first_layer, share.num_layers, share.terms, share.budget_bytes)
                     + (" (and the draft model)" if share.holds_draft else "") for share in found.shares]
    applied.lines += [f"memory plan: {step}" for step in found.degradations]
    return applied


def apply_split(choice: ModelChoice, budget: MemoryBudget | None, target_settings: ModelSettings,
                speculation: SpeculationSettings, max_new_tokens: int, temperature: float,
                repack: tuple[bool, ...] = REPACK_EITHER) -> MemoryPlan:
    """The devices (from --devices or the budget's names), each one's blocks, and the notes that show them."""
    budgets = None
    if budget is not None:
        budgets = list(budget.per_device)
        target_settings = replace(target_settings, devices=tuple(budget.name for budget in budgets))
    check_devices(target_settings)  # the budget may have named the devices
    applied = MemoryPlan(choice, target_settings, speculation, shown_after_loading=True)
    if budgets is None:
        counts = layer_counts(target_settings.layers_per_device, shape_from_gguf(choice.target_path).num_layers,
                              len(target_settings.devices))
        mode = "row split: every device a slice of every block" if target_settings.split_mode == "row" else (
            "layer split: " + ", ".join(f"{device} {count} blocks" for device, count in
                                        zip(target_settings.devices, counts)))
        applied.lines = [f"{mode} (no --memory-budget: an even split)"]
        return applied
    applied.budget_bytes = sum(budget.budget_bytes for budget in budgets)
    if target_settings.backend == "torch":
        return _torch_split(applied, budgets)
    return _llama_split(applied, budgets, max_new_tokens, temperature, repack)
