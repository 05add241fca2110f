"""How long a step's draft may be: one type, resolved in one place.

The settings ask (requested_draft_limits): nothing without a drafter; a fixed --gamma for every
drafter; else --max-gamma for a draft model and the draftless ceiling for n-gram proposals. The
target then narrows that to the widest verify it can run (DraftLimits.within): its logits rows, which
a memory plan sizes, and with --exact-verify the widest batch that rounds like one-token decoding.
The verify width a run allocates, the planner's workload and both engines' controllers read these
values. A memory plan's own choice of γ enters earlier, as settings (budget/llama_plan.py,
settings_from_plan), and on torch --batch with a fixed --gamma makes it --max-gamma (batch_speculation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pocketspec.backends.exact_width import wider_exact_advice
from pocketspec.speculation.verify_mode import capped_exact_line
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
    """A torch batch's settings: the batch plan sizes its rows' verifies for --max-gamma drafts
    (BatchedModel.max_logits_rows, where its engine caps every draft), so a fixed --gamma becomes --max-gamma."""
    return speculation if speculation.gamma is None else replace(speculation, max_gamma=speculation.gamma)


def widest_verified_draft(target, speculation: SpeculationSettings, requested: DraftLimits, notes: list[str],
                          on_measure=None) -> int:
    """The longest draft `target` (a Backend, or one sequence of a batch's context) can verify: its logits
    rows allow it, and with --exact-verify its verify pass (γ + 1 rows) reproduces one-token logits exactly
    (probed once, pocketspec/backends/exact_width.py; on_measure(line) is told before a probe). What the
    user should know goes to `notes`."""
    max_width = min(requested.verify_width, target.max_logits_rows)
    if not speculation.exact_verify or requested.widest == 0:
        return max_width - 1
    exact_width = target.exact_verify_width(max_width, on_measure)
    settings = getattr(target, "settings", None)
    advice = None if settings is None else wider_exact_advice(settings, exact_width)
    if exact_width == 1:
        notes.append("--exact-verify: no verify batch rounds exactly like one-token decoding on this "
                     "backend, so decoding is plain; --fast-verify drafts" + (f"; {advice}" if advice else ""))
    elif exact_width < max_width:
        notes.append(capped_exact_line(exact_width, max_width) + (f"; {advice}" if advice else ""))
    return exact_width - 1
