"""`pocketspec plan --batch N` (torch): the batch plan's memory terms, and the speedup a draft is predicted to
give over plain batched decoding by context, with the context from which it pays (MagicDec's terms:
memplanner/batch_step_costs.py). Loads nothing: the costs are this machine's where `pocketspec doctor
--calibrate --batch N` measured them, else the roofline of the models' shapes."""

from __future__ import annotations

from dataclasses import dataclass

from memplanner.batch_step_costs import SpeedupPrediction, crossover_context, predicted_speedup
from memplanner.defaults import ACCEPTANCE_PRIORS
from memplanner.sizes import format_bytes
from pocketspec.backends.torch_open import check_self_draft, self_sparse_window
from pocketspec.batch.step_costs import batch_models, batch_step_costs
from pocketspec.budget.batch_plan import apply_batch_plan
from pocketspec.budget.device_memory import read_device
from pocketspec.budget.memory_plan import MemoryPlan
from pocketspec.errors import UserError
from pocketspec.session_settings import SessionSettings, settings_for
from pocketspec.settings import BatchSettings
from pocketspec.speculation.draft_limits import batch_speculation


@dataclass(frozen=True)
class BatchPreview:
    title: str
    plan: MemoryPlan
    alpha: float  # the acceptance the predictions assume (--alpha)
    predictions: tuple[SpeedupPrediction, ...] = ()  # by context; none without a draft model or self-draft
    crossover: int | None = None  # the shortest context from which drafting pays; None where it never does
    is_measured: bool = False  # the costs are this machine's


def preview_contexts(max_context: int) -> list[int]:
    """512, 1k, 2k, ... below max_context, and max_context."""
    contexts, context = [], 512
    while context < max_context:
        contexts.append(context)
        context *= 2
    return [*contexts, max_context]


def preview_batch_plan(settings: SessionSettings, batch: BatchSettings) -> BatchPreview:
    """The plan `generate --batch N` runs on these settings, within --memory-budget (else what the device has
    free now), and what drafting is predicted to give at the planned batch size."""
    choice, target_settings, speculation = settings_for(settings)
    if target_settings.backend != "torch":
        raise UserError("plan --batch plans the torch backend's batch pool; add --backend torch")
    if len(target_settings.devices) > 1:
        raise UserError("plan --batch plans the pool of one device; leave out --devices")
    if choice.drafter in ("self-sparse", "self-skip"):
        check_self_draft(choice.drafter, target_settings, speculation)
    speculation = batch_speculation(speculation)
    device = read_device(target_settings.device)
    budget_bytes = settings.budget.total_bytes if settings.budget is not None else device.free_bytes
    if budget_bytes is None:
        raise UserError(f"cannot read {device.name}'s free memory (torch sees no such GPU); pass --memory-budget")
    plan = apply_batch_plan(choice, budget_bytes, target_settings, speculation, batch)
    rows = plan.batch.max_batch
    title = (f"batch plan for {choice.target_path.stem} ({_drafting(choice, target_settings, speculation)}), "
             f"{rows} rows, max context {target_settings.max_context}, budget "
             f"{format_bytes(plan.budget_bytes)} on {device.name}")
    models = batch_models(choice, target_settings, speculation, plan.batch)
    target, *draft = (batch_step_costs(model, target_settings) for model in models)
    if draft and target.is_measured != draft[0].is_measured:  # one measured, one not: not comparable
        target, *draft = (batch_step_costs(model, target_settings, may_be_measured=False) for model in models)
    draft = draft[0] if draft else None
    alpha = speculation.expected_acceptance if speculation.expected_acceptance is not None else \
        ACCEPTANCE_PRIORS["model"]
    if draft is None:
        return BatchPreview(title, plan, alpha, is_measured=target.is_measured)
    predictions = tuple(predicted_speedup(target, draft, num_rows=rows, context=context, alpha=alpha,
                                          max_gamma=speculation.max_gamma)
                        for context in preview_contexts(target_settings.max_context))
    crossover = crossover_context(target, draft, num_rows=rows, alpha=alpha, max_gamma=speculation.max_gamma,
                                  max_context=target_settings.max_context)
    return BatchPreview(title, plan, alpha, predictions, crossover, target.is_measured and draft.is_measured)


def _drafting(choice, target_settings, speculation) -> str:
    if choice.drafter == "self-sparse":
        return f"self-sparse draft over {self_sparse_window(target_settings, speculation)} positions"
    if choice.draft_path is not None:
        return f"draft {choice.draft_path.stem}"
    return f"{choice.drafter} drafting" if choice.drafter != "none" else "plain decoding"

