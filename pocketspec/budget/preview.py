"""`pocketspec plan`'s answer, loading nothing: the plan for a pair, a budget and a context on this
device (or on described devices for a split), predicted with this machine's measured costs when
they are there."""

from __future__ import annotations

from dataclasses import dataclass

from memplanner.defaults import MAX_DRAFTLESS_GAMMA
from memplanner.device import detect_device
from memplanner.planner import Workload, plan
from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes, parse_size
from memplanner.split import is_per_device_budget, parse_device_budgets, plan_split
from pocketspec.calibrate import machine_costs
from pocketspec.errors import UserError
from pocketspec.loader import choose_models, trained_context_limit
from pocketspec.session_settings import repack_allowed
from pocketspec.settings import ModelSettings


@dataclass(frozen=True)
class PlanPreview:
    result: object  # memplanner's Plan, or SplitPlan when is_split
    title: str  # "plan for <pair>, max context N, budget B on <device>" (or split over <devices>)
    is_split: bool
    uses_measured_costs: bool  # speed from this machine's cost table, else from the reference tables


def preview_plan(*, target, draft, pair, memory_budget: str | None, devices: str | None, max_context: int,
                 max_new_tokens: int, temperature: float, max_gamma: int, kv_type: str, alpha: float | None,
                 repack: bool | None) -> PlanPreview:
    is_split = devices is not None or is_per_device_budget(memory_budget)
    if is_split and memory_budget is None:
        raise UserError("--devices needs --memory-budget: one size per device, e.g. 6GiB,4GiB")
    try:
        budget_bytes = parse_size(memory_budget) if memory_budget is not None and not is_split else None
    except ValueError as error:
        raise UserError(f"--memory-budget: {error}") from None
    choice = choose_models(target=target, draft=draft, pair=pair)
    target_shape = shape_from_gguf(choice.target_path)
    draft_shape = shape_from_gguf(choice.draft_path) if choice.draft_path else None
    trained_context_limit(choice.target_path, max_context, max_context)
    # `--draft none` asks for plain decoding: no gamma to plan
    is_plain = choice.drafter == "none"
    workload = Workload(max_context, max_new_tokens, 1, 0 if is_plain else max_gamma, temperature,
                        target_kv_type=kv_type, max_draftless_gamma=0 if is_plain else MAX_DRAFTLESS_GAMMA)
    drafting = "n-gram drafting" if choice.drafter == "ngram" else "plain decoding"
    pair_name = target_shape.name + (f" + {draft_shape.name}" if draft_shape else f" ({drafting})")
    if is_split:
        try:
            budgets = parse_device_budgets(devices, memory_budget or "")
        except ValueError as error:
            raise UserError(str(error)) from None
        result = plan_split(budgets, target_shape, draft_shape, workload, alpha=alpha, repack=repack_allowed(repack))
        if not result.feasible:
            raise UserError(result.reason)
        title = (f"plan for {pair_name}, max context {max_context}, split over "
                 f"{', '.join(budget.name for budget in budgets)}")
        return PlanPreview(result, title, True, False)
    device = detect_device()
    if budget_bytes is None:
        budget_bytes = device.free_bytes
    costs = machine_costs(choice.target_path, choice.draft_path, ModelSettings(kv_type=kv_type))
    result = plan(budget_bytes, target_shape, draft_shape, workload, device=device, alpha=alpha,
                  repack=repack_allowed(repack), costs=costs)
    if not result.feasible:
        raise UserError(f"{result.reason}; raise --memory-budget or lower --max-context")
    title = f"plan for {pair_name}, max context {max_context}, budget {format_bytes(budget_bytes)} on {device.name}"
    return PlanPreview(result, title, False, costs is not None)
