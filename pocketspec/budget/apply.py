"""Which planner sizes a session: a split, the torch or ONNX backend's sizes, or llama.cpp's planner."""

from __future__ import annotations

from memplanner.planner import REPACK_EITHER
from memplanner.memory_budget import MemoryBudget, is_split
from pocketspec.budget.memory_plan import MemoryPlan
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings


def apply_budget(choice: ModelChoice, budget: MemoryBudget | None, target_settings: ModelSettings,
                 speculation: SpeculationSettings, *, max_new_tokens: int, temperature: float,
                 repack: tuple[bool, ...] = REPACK_EITHER, num_sequences: int = 1) -> MemoryPlan | None:
    """The plan for these settings (None: no budget and no split); UserError when nothing fits.
    num_sequences: how many sequences share target_settings' context (llama.cpp prices each one's logits rows)."""
    if is_split(target_settings.devices, budget):
        from pocketspec.budget.split_plan import apply_split

        return apply_split(choice, budget, target_settings, speculation, max_new_tokens, temperature,
                           repack=repack)
    if budget is None:
        return None
    if target_settings.backend == "onnx":
        from pocketspec.budget.onnx_plan import apply_onnx_plan

        return apply_onnx_plan(choice, budget.total_bytes, target_settings, speculation)
    if target_settings.backend == "torch":
        from pocketspec.budget.torch_plan import apply_torch_plan

        return apply_torch_plan(choice, budget.total_bytes, target_settings, speculation)
    from pocketspec.budget.llama_plan import apply_plan

    return apply_plan(choice, budget.total_bytes, target_settings, speculation, max_new_tokens, temperature,
                      repack=repack, num_sequences=num_sequences)
