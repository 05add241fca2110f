"""Which planner sizes a session: a split, the torch backend's exact sizes, or llama.cpp's planner."""

from __future__ import annotations

from memplanner.planner import REPACK_EITHER
from memplanner.split import is_split
from pocketspec.budget.memory_plan import MemoryPlan
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings


def apply_budget(choice: ModelChoice, memory_budget: str | None, target_settings: ModelSettings,
                 speculation: SpeculationSettings, *, max_new_tokens: int, temperature: float,
                 repack: tuple[bool, ...] = REPACK_EITHER) -> MemoryPlan | None:
    """The plan for these settings (None: no budget and no split); UserError when nothing fits."""
    if is_split(target_settings.devices, memory_budget):
        from pocketspec.budget.split_plan import apply_split

        return apply_split(choice, memory_budget, target_settings, speculation, max_new_tokens, temperature,
                           repack=repack)
    if memory_budget is None:
        return None
    if target_settings.backend == "torch":
        from pocketspec.budget.torch_plan import apply_torch_plan

        return apply_torch_plan(choice, memory_budget, target_settings, speculation)
    from pocketspec.budget.llama_plan import apply_plan

    return apply_plan(choice, memory_budget, target_settings, speculation, max_new_tokens, temperature, repack=repack)
