"""`pocketspec plan --batch N` (torch): the batch plan's memory terms, and the speedup a draft is predicted to
give over plain batched decoding by context, with the context from which it pays (MagicDec's terms:
memplanner/batch_step_costs.py). Loads nothing: the costs are this machine's where `pocketspec doctor
--calibrate --batch N` measured them, else the roofline of the models' shapes."""

from __future__ import annotations

from dataclasses import dataclass

from memplanner.batch_rows import kv_dtype_for
from memplanner.batch_step_costs import SpeedupPrediction, StepCosts, crossover_context, predicted_speedup
from memplanner.defaults import ACCEPTANCE_PRIORS
from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes
from memplanner.torch_sizes import resolve_weights_format
from pocketspec.backends.torch_open import check_self_draft, self_skip_layers, self_sparse_window
from pocketspec.batch.step_costs import BatchShape, batch_step_costs
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
    on_gpu = target_settings.is_on_gpu
    weights = resolve_weights_format(target_settings.weights, on_gpu)
    kv_dtype = kv_dtype_for(target_settings.torch_kv_type, weights, on_gpu)
    num_layers = shape_from_gguf(choice.target_path).num_layers
    width = speculation.max_gamma + 1
    target_shape = BatchShape(rows, target_settings.max_context, width, batch.batch_invariance_on(device.kind),
                              kv_dtype, num_layers)
    title = (f"batch plan for {choice.target_path.stem} ({_drafting(choice, target_settings, speculation)}), "
             f"{rows} rows, max context {target_settings.max_context}, budget "
             f"{format_bytes(plan.budget_bytes)} on {device.name}")
    draft_shape = _draft_shape(choice, target_settings, speculation, weights, on_gpu, rows, width)

    def priced(may_be_measured: bool) -> tuple[StepCosts, StepCosts | None]:
        costs = dict(weights_format=weights, on_gpu=on_gpu, may_be_measured=may_be_measured)
        target = batch_step_costs(choice.target_path, target_settings, target_shape, **costs)
        if draft_shape is None:
            return target, None
        path, shape = draft_shape
        return target, batch_step_costs(path, target_settings, shape, **costs,
                                        is_window=choice.drafter == "self-sparse")

    target, draft = priced(True)
    if draft is not None and target.is_measured != draft.is_measured:  # one measured, one not: not comparable
        target, draft = priced(False)
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


def _draft_shape(choice, target_settings, speculation, weights: str, on_gpu: bool, rows: int,
                 width: int) -> tuple[object, BatchShape] | None:
    """The draft's model file and batch shape, as pocketspec/batch/open.py opens it; None without a draft."""
    shape = shape_from_gguf(choice.target_path)
    fast = dict(num_rows=rows, width=width, is_batch_invariant=False)
    kv_dtype = kv_dtype_for(target_settings.torch_kv_type, weights, on_gpu)
    if choice.drafter == "self-sparse":
        return choice.target_path, BatchShape(
            max_context=self_sparse_window(target_settings, speculation), num_layers=shape.num_layers,
            kv_dtype=kv_dtype_for(speculation.self_draft_kv_type, weights, on_gpu), **fast)
    if choice.drafter == "self-skip":
        return choice.target_path, BatchShape(max_context=target_settings.max_context, kv_dtype=kv_dtype,
                                              num_layers=self_skip_layers(shape.num_layers, speculation), **fast)
    if choice.draft_path is not None:
        return choice.draft_path, BatchShape(max_context=target_settings.max_context, kv_dtype=kv_dtype,
                                             num_layers=shape_from_gguf(choice.draft_path).num_layers, **fast)
    return None
