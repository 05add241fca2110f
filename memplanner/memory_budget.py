"""--memory-budget parsed once, into bytes: one budget for the whole process, or one per device of a split.

A budget is per device when it names devices (cuda:0=6GiB,cuda:1=4GiB), gives several sizes (6GiB,4GiB),
or the run uses several devices (--devices cuda:0,cuda:1 with 6GiB gives each device 6GiB); otherwise it is
the whole process's, as `top` shows it. is_split is the one answer to "is this run a split?".
"""

from __future__ import annotations

from dataclasses import dataclass

from memplanner.sizes import parse_size
from memplanner.split import DeviceBudget, parse_device_budgets


@dataclass(frozen=True)
class MemoryBudget:
    total_bytes: int  # the whole process's budget, or the sum of the devices' budgets
    per_device: tuple[DeviceBudget, ...] = ()  # empty: one budget for the whole process (no split)


def parse_memory_budget(text: str, devices: tuple[str, ...] = ()) -> MemoryBudget:
    """The budget for a run on `devices` (empty: one device); ValueError with a one-line message when bad."""
    if len(devices) > 1 or "," in text or "=" in text:
        shares = tuple(parse_device_budgets(",".join(devices) or None, text))
        return MemoryBudget(sum(share.budget_bytes for share in shares), shares)
    try:
        total_bytes = parse_size(text)
    except ValueError as error:
        raise ValueError(f"--memory-budget {text!r}: {error}") from None
    if total_bytes <= 0:
        rounded = " (it rounds to 0 bytes; write e.g. 512MiB or 3GiB)" if any(c in "123456789" for c in text) else ""
        raise ValueError(f"--memory-budget must be positive, got {text!r}{rounded}")
    return MemoryBudget(total_bytes)


def is_split(devices: tuple[str, ...], budget: MemoryBudget | None) -> bool:
    """Whether the target is split: several devices, or a budget given per device."""
    return len(devices) > 1 or (budget is not None and bool(budget.per_device))
