"""`--memory-budget` applied to a session: one entry (apply_budget) and one result (MemoryPlan),
whichever backend, split or batch planned it. The planning itself is memplanner's."""

from pocketspec.budget.apply import apply_budget
from pocketspec.budget.memory_plan import MemoryPlan

__all__ = ["MemoryPlan", "apply_budget"]
