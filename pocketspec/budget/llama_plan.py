"""`--memory-budget` on llama.cpp, one device: plan first, refuse early, size every buffer from the plan."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memplanner.device import DeviceInfo
from memplanner.options import PlanSettings
from memplanner.planner import REPACK_EITHER, Plan, Workload, min_budget_any, plan
from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes
from pocketspec.budget.device_memory import read_device
from pocketspec.budget.memory_plan import LIGHTEST_CONTEXT, MemoryPlan, peak_line
from pocketspec.calibrate import machine_costs
from pocketspec.speculation.draft_limits import requested_draft_limits
from pocketspec.errors import BudgetError, UserError
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings, draft_settings_for


def describe(plan_: Plan) -> str:
    settings = plan_.settings
    parts = [f"drafter {settings.drafter}", f"max γ {settings.max_gamma}",
             f"target KV {settings.target_kv_type} × {settings.target_n_ctx}", f"n_ubatch {settings.n_ubatch}"]
    if settings.drafter == "model":
        parts.append(f"draft KV {settings.draft_kv_type}, window {settings.draft_kv_window}")
    if not settings.repack_weights:
        parts.append("weights not repacked")
    return peak_line("", plan_.predicted_peak_bytes, plan_.budget_bytes, ", ".join(parts))


def keeps_draft_model(choice: ModelChoice, speculation: SpeculationSettings) -> bool:
    """The user asked for the draft model itself (`--draft NAME`, or settings whose drafter is `model`), not only
    a pair that has one: a memory plan loads it or refuses, never plans n-gram or plain decoding in its place."""
    if choice.draft_path is None or speculation.drafter not in ("auto", "model"):
        return False
    return choice.draft_is_explicit or speculation.drafter == "model"


def workload_for(choice: ModelChoice, target_settings: ModelSettings, speculation: SpeculationSettings,
                 max_new_tokens: int, temperature: float, num_sequences: int = 1) -> Workload:
    """What the user asked for, the target's KV type included (the plan keeps it as it is); num_sequences:
    how many share target_settings' context."""
    # `--draft none` asks for plain decoding: plan no draft buffers at all (γ = 0); a fixed --gamma caps both
    limits = requested_draft_limits(speculation, drafts=choice.drafter != "none")
    return Workload(max_context=target_settings.max_context, max_new_tokens=max_new_tokens,
                    max_gamma=limits.model, temperature=temperature, target_kv_type=target_settings.kv_type,
                    max_draftless_gamma=limits.draftless,
                    keeps_draft_model=keeps_draft_model(choice, speculation), num_sequences=num_sequences)


def planned_device_name(settings: ModelSettings) -> str:
    """Where llama.cpp really runs the target: the one device named, else GPU 0 when layers are offloaded
    (llama.cpp's main_gpu), else the CPU."""
    if settings.devices:
        return settings.devices[0]
    return "cuda:0" if settings.gpu_layers != 0 else "cpu"


@dataclass(frozen=True)
class DevicePlan:
    """The planner's answer for one device, before it is put into the runtime's settings."""

    plan: Plan
    device: DeviceInfo
    budget_bytes: int  # what was planned for: the budget, or what is free when that is less
    uses_measured_costs: bool  # speed from this machine's cost table, else from the reference tables
    notes: list[str]


def plan_on_device(choice: ModelChoice, budget_bytes: int | None, target_settings: ModelSettings,
                   speculation: SpeculationSettings, max_new_tokens: int, temperature: float,
                   repack: tuple[bool, ...] = REPACK_EITHER, device: DeviceInfo | None = None,
                   num_sequences: int = 1) -> DevicePlan:
    """The plan for the device the settings run on (or `device` as described), within `budget_bytes`
    (None: what is free there). `pocketspec plan` shows this; `apply_plan` runs it. num_sequences: how many
    sequences share the settings' context (each one's logits rows priced; a refusal names each one's context)."""
    target_shape = shape_from_gguf(choice.target_path)
    draft_shape = shape_from_gguf(choice.draft_path) if choice.draft_path is not None else None
    workload = workload_for(choice, target_settings, speculation, max_new_tokens, temperature, num_sequences)
    device = device or read_device(planned_device_name(target_settings))
    notes = []
    if budget_bytes is None:
        if device.free_bytes is None:
            raise UserError(f"cannot read {device.name}'s free memory (torch sees no such GPU); pass --memory-budget")
        budget_bytes = device.free_bytes
    elif device.free_bytes is None:
        notes.append(f"memory plan: cannot read {device.name}'s free memory (torch sees no such GPU); "
                     f"planning for the whole --memory-budget {format_bytes(budget_bytes)}")
    elif budget_bytes > device.free_bytes:
        notes.append(f"memory plan: --memory-budget {format_bytes(budget_bytes)} is more than the "
                     f"{format_bytes(device.free_bytes)} free now; planning for what is free")
        budget_bytes = device.free_bytes
    costs = machine_costs(choice.target_path, choice.draft_path, target_settings, draft_settings_for(target_settings))
    plan_ = plan(budget_bytes, target_shape, draft_shape, workload, device=device,
                 alpha=speculation.expected_acceptance, repack=repack, costs=costs)
    if not plan_.feasible:
        without_draft = ", or pass --draft ngram" if plan_.min_budget_loads_draft else ""
        shortest = replace(workload, max_context=min(workload.max_context, LIGHTEST_CONTEXT * num_sequences))
        shortest_bytes = min_budget_any(target_shape, shortest, device, repack, draft_shape)
        if budget_bytes < shortest_bytes:  # a shorter context would not fit either
            raise BudgetError(f"{plan_.reason}; even --max-context {shortest.max_context // num_sequences} needs "
                              f"{format_bytes(shortest_bytes)}: raise --memory-budget{without_draft}, or choose a "
                              "smaller model")
        raise BudgetError(f"{plan_.reason}; raise --memory-budget or lower --max-context{without_draft}")
    return DevicePlan(plan_, device, budget_bytes, costs is not None, notes)


def apply_plan(choice: ModelChoice, budget_bytes: int, target_settings: ModelSettings,
               speculation: SpeculationSettings, max_new_tokens: int, temperature: float,
               repack: tuple[bool, ...] = REPACK_EITHER, device: DeviceInfo | None = None,
               num_sequences: int = 1) -> MemoryPlan:
    """The plan for one device put into the runtime's settings: `device` as described, or the one the settings
    name, read now."""
    planned = plan_on_device(choice, budget_bytes, target_settings, speculation, max_new_tokens,
                             temperature, repack, device, num_sequences)
    plan_ = planned.plan
    notes = planned.notes + [describe(plan_)] + [f"memory plan: {step}" for step in plan_.degradations]
    choice, target_settings, speculation, draft_max_context = settings_from_plan(
        plan_.settings, choice, target_settings, speculation)
    return MemoryPlan(choice, target_settings, speculation, planned.budget_bytes, notes,
                      draft_max_context=draft_max_context, predicted_peak_bytes=plan_.predicted_peak_bytes,
                      planner_result=plan_)


def settings_from_plan(settings: PlanSettings, choice: ModelChoice, target_settings: ModelSettings,
                       speculation: SpeculationSettings):
    """The planned drafter, draft KV cache, batch and γ put into the runtime's settings:
    (choice, target_settings, speculation, draft_max_context). The target's KV type is the user's:
    the plan was made with it (Workload.target_kv_type) and never changes it."""
    runtime_drafter = {"model": "auto", "ngram": "ngram", "none": "none"}[settings.drafter]
    draft_path = choice.draft_path if runtime_drafter == "auto" else None
    # a draft the user named stays theirs: the loader loads it even where measured costs say it cannot pay
    choice = ModelChoice(choice.target_path, draft_path, runtime_drafter, choice.draft_is_explicit)
    if settings.target_kv_type != target_settings.kv_type:
        raise AssertionError(f"the plan changed the target's KV type {target_settings.kv_type} -> "
                             f"{settings.target_kv_type}")
    # The context stays the user's (the plan's target_n_ctx is it, padded as llama.cpp pads): a plan that added
    # γ + 1 verify cells to it let a budgeted run decode past --max-context where the same run without a budget
    # stopped, context full.
    target_settings = replace(
        target_settings,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_ubatch,
        max_logits_rows=max(1, settings.logits_rows),
        repack_weights=settings.repack_weights,
    )
    fixed_gamma = None if speculation.gamma is None else min(speculation.gamma, settings.max_gamma)
    # an n-gram plan's γ is the draftless one; a draft model's plan verifies n-grams up to its logits rows too
    max_gamma = min(settings.max_gamma, speculation.max_gamma) if settings.drafter == "ngram" else settings.max_gamma
    speculation = replace(speculation, drafter=runtime_drafter, max_gamma=max_gamma, gamma=fixed_gamma,
                          max_draftless_gamma=max(settings.logits_rows - 1, 0), draft_kv_type=settings.draft_kv_type)
    draft_max_context = settings.draft_n_ctx if draft_path is not None else None
    return choice, target_settings, speculation, draft_max_context
