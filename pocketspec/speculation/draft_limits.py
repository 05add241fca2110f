"""How long a step's draft may be: one type, resolved in one place.

The settings ask (requested_draft_limits): nothing without a drafter; a fixed --gamma for every
drafter; else --max-gamma for a draft model and the draftless ceiling for n-gram proposals. The
target then narrows that to the widest verify it can run (DraftLimits.within): its logits rows, which
a memory plan sizes, and with --exact-verify the widest batch that rounds like one-token decoding.
The verify width a run allocates, the planner's workload and both engines' controllers read these
values. A memory plan's own choice of γ enters earlier, as settings (budget/llama_plan.py,
settings_from_plan), and --batch with a fixed --gamma makes it --max-gamma (batch_speculation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pocketspec.settings import SpeculationSettings


@dataclass(frozen=True)
class DraftLimits:
    model: int  # a draft model's longest draft
    draftless: int  # an n-gram proposal's longest draft (free to draft: only the verify limits it)
    fixed: int | None = None  # --gamma N, within both; None: the controller chooses γ

    @property
    def widest(self) -> int:
        return max(self.model, self.draftless)

    @property
    def verify_width(self) -> int:
        """Rows of the widest verify: the longest draft and the target's own next token."""
        return self.widest + 1

    def within(self, widest: int) -> DraftLimits:
        """These limits where no draft may be longer than `widest` (a verify of widest + 1 rows)."""
        widest = max(widest, 0)
        fixed = None if self.fixed is None else min(self.fixed, widest)
        return DraftLimits(min(self.model, widest), min(self.draftless, widest), fixed)


def requested_draft_limits(speculation: SpeculationSettings, drafts: bool = True) -> DraftLimits:
    """What the settings ask for, before a backend narrows it; `drafts` False when nothing can draft."""
    if not drafts or speculation.drafter == "none":
        return DraftLimits(0, 0)
    if speculation.gamma is not None:
        return DraftLimits(speculation.gamma, speculation.gamma, speculation.gamma)
    if speculation.drafter == "model":
        return DraftLimits(speculation.max_gamma, speculation.max_gamma)
    return DraftLimits(speculation.max_gamma, max(speculation.max_gamma, speculation.max_draftless_gamma))


def batch_speculation(speculation: SpeculationSettings) -> SpeculationSettings:
    """A batch's settings: its rows' verifies are sized for --max-gamma drafts (the batch plan, a llama.cpp
    context's logits rows) and its engine caps every draft there, so a fixed --gamma becomes --max-gamma."""
    return speculation if speculation.gamma is None else replace(speculation, max_gamma=speculation.gamma)
