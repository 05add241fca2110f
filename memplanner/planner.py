"""The planner: a pure function of model shapes, device, budget and workload to a Plan.

plan() keeps every candidate (memplanner/options.py) whose predicted peak fits the budget
and takes the fastest by the step-cost model (memplanner/costs.py). The feasible set only
grows with the budget, so more budget never gives a slower plan. A budget below
min_budget_any, the smallest candidate (plain decoding at the user's KV type, smallest
n_ubatch; with the draft model where the user named it: Workload.keeps_draft_model), is refused
before anything loads;
the refusal names `--kv-type q8_0` when only a quantized target KV cache would fit, since
that changes the target's output and is the user's choice, never the planner's.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace

from memplanner.costs import CPU_REFERENCES
from memplanner.defaults import ACCEPTANCE_PRIORS, N_BATCH
from memplanner.device import DeviceInfo
from memplanner.measured_costs import MachineCosts
from memplanner.options import Candidate, PlanSettings, Workload, candidate_settings, evaluate
from memplanner.shapes import ModelShape
from memplanner.sizes import format_bytes
from memplanner import terms

__all__ = ["Plan", "PlanSettings", "Workload", "plan", "min_budget_any", "min_budget_keep",
           "naive_generation_terms", "naive_generation_bytes", "generation_bytes"]

UNLIMITED = 1 << 62
REPACK_EITHER = (True, False)  # the plan may repack llama.cpp's CPU weights or not
_MODEL_TERMS = ("process_base", "huge_page_rounding", "runtime_overhead", "weights", "repacked_weights",
                "metadata")  # not generation memory
QUANTIZED_TARGET_KV = ("q8_0", "q4_0")  # suggested to the user, in this order, when f16 does not fit


@dataclass
class Plan:
    feasible: bool
    budget_bytes: int
    terms: dict[str, int]
    settings: PlanSettings | None
    predicted_peak_bytes: int
    predicted_tokens_per_second: float
    degradations: list[str] = field(default_factory=list)
    min_budget_any_bytes: int = 0
    min_budget_keep_bytes: int = 0
    reason: str = ""
    min_budget_loads_draft: bool = False  # the least budget is for the draft model too: the workload keeps it

    def to_dict(self) -> dict:
        found = asdict(self)
        found["settings"] = asdict(self.settings) if self.settings else None
        return found


def alpha_table(alpha: float | dict[str, float] | None) -> tuple:
    """A float sets the model drafter's acceptance; a dict sets any drafter's."""
    table = dict(ACCEPTANCE_PRIORS)
    if isinstance(alpha, dict):
        table.update(alpha)
    elif alpha is not None:
        table["model"] = float(alpha)
    return tuple(sorted(table.items()))


@functools.lru_cache(maxsize=32)
def plan_candidates(target: ModelShape, draft: ModelShape | None, workload: Workload, device_kind: str,
                alpha_items: tuple, repack: tuple[bool, ...], costs: MachineCosts | None = None) -> tuple[Candidate, ...]:
    """costs: this machine's calibrated forward costs; None predicts speed from the reference tables."""
    alpha = dict(alpha_items)
    return tuple(evaluate(s, target, draft, workload, alpha, costs or CPU_REFERENCES)
                 for s in candidate_settings(target, draft, workload, device_kind, repack))


def _best(candidates, budget_bytes: int) -> Candidate | None:
    fitting = [c for c in candidates if c.peak_bytes <= budget_bytes]
    return max(fitting, key=lambda c: c.preference) if fitting else None


def _device_kind(device: DeviceInfo | str | None) -> str:
    return device if isinstance(device, str) else (device.kind if device else "cpu")


def _smallest(target: ModelShape, draft: ModelShape | None, workload: Workload, device_kind: str,
              repack: tuple[bool, ...] = REPACK_EITHER) -> Candidate:
    """The candidate with the least predicted peak: plain decoding, as small as it gets (a draft
    only adds to a candidate, so this is the smallest of plan()'s candidates with or without one);
    where the workload keeps the draft model, the smallest that loads it."""
    kept_draft = draft if workload.plans_draft_model_only else None
    candidates = plan_candidates(target, kept_draft, workload, device_kind, alpha_table(None), repack)
    return min(candidates, key=lambda c: (c.peak_bytes, -c.tokens_per_second))


def min_budget_any(target: ModelShape, workload: Workload, device: DeviceInfo | str | None = None,
                   repack: tuple[bool, ...] = REPACK_EITHER, draft: ModelShape | None = None) -> int:
    """Least memory that runs the target with plain decoding at the requested context and KV type
    (with the draft model where the workload keeps it): the least budget plan() accepts."""
    return _smallest(target, draft, workload, _device_kind(device), repack).peak_bytes


def min_budget_keep(target: ModelShape, draft: ModelShape | None, workload: Workload, fraction: float = 0.95,
                    device: DeviceInfo | str | None = None, alpha=None, repack: tuple[bool, ...] = REPACK_EITHER,
                    costs: MachineCosts | None = None) -> int:
    """Least budget whose plan predicts >= fraction x the unconstrained plan's tokens/s.

    plan() takes the fastest candidate that fits, so this is exactly the smallest peak among
    candidates that fast (no search needed; tests check it against a bisection).
    """
    kind = _device_kind(device)
    candidates = plan_candidates(target, draft, workload, kind, alpha_table(alpha), repack, costs)
    fastest = _best(candidates, UNLIMITED).tokens_per_second
    fast_enough = min(c.peak_bytes for c in candidates if c.tokens_per_second >= fraction * fastest)
    return max(fast_enough, min_budget_any(target, workload, kind, repack, draft))


def _label(term: str) -> str:
    return term.replace("_", " ")


def degradations_from(chosen_candidate: Candidate, best_candidate: Candidate) -> list[str]:
    chosen, best = chosen_candidate.settings, best_candidate.settings
    is_slower = chosen_candidate.tokens_per_second < best_candidate.tokens_per_second
    found = []
    if chosen.n_ubatch < best.n_ubatch:
        found.append(f"prompt micro-batch n_ubatch {best.n_ubatch} -> {chosen.n_ubatch}: smaller compute "
                     "buffer, slower prompt processing")
    if chosen.drafter == "model" and best.drafter == "model" and chosen.draft_kv_window < best.draft_kv_window:
        found.append(f"draft KV window {best.draft_kv_window} -> {chosen.draft_kv_window} tokens "
                     "(attention sinks + most recent, StreamingLLM-style)")
    if chosen.drafter == "model" and best.drafter == "model" and chosen.draft_kv_type != best.draft_kv_type:
        found.append(f"draft KV cache quantized {best.draft_kv_type} -> {chosen.draft_kv_type}: "
                     "may lower the acceptance rate, never changes the output")
    # a lower γ ceiling that the runtime would not have used anyway is no loss
    if chosen.drafter == best.drafter and 0 < chosen.max_gamma < best.max_gamma and is_slower:
        found.append(f"max draft length gamma {best.max_gamma} -> {chosen.max_gamma}")
    if best.repack_weights and not chosen.repack_weights:
        found.append("weights not repacked for the CPU kernels: saves their copy, decoding is slower")
    if chosen.drafter != best.drafter:
        if chosen.drafter == "ngram":
            found.append("n-gram drafting instead of the draft model: its weights and KV cache are not loaded")
        elif chosen.drafter == "none":
            found.append("plain decoding: no speculative configuration fits the budget")
    return found


def plan(budget_bytes: int, target: ModelShape, draft: ModelShape | None, workload: Workload,
         device: DeviceInfo | str | None = None, alpha: float | dict[str, float] | None = None,
         repack: tuple[bool, ...] = REPACK_EITHER, costs: MachineCosts | None = None) -> Plan:
    """The fastest configuration whose predicted peak fits budget_bytes, or a refusal.

    `repack` lists the weight layouts allowed: (True,) or (False,) when the user fixed one.
    `costs`: this machine's calibrated forward costs (pocketspec/calibrate.py), when measured.
    """
    kind = _device_kind(device)
    candidates = plan_candidates(target, draft, workload, kind, alpha_table(alpha), repack, costs)
    minimum = _smallest(target, draft, workload, kind, repack)
    loads_draft = minimum.settings.drafter == "model"
    keep = min_budget_keep(target, draft, workload, device=kind, alpha=alpha, repack=repack, costs=costs)
    if budget_bytes < minimum.peak_bytes:
        name, size = max(minimum.terms.items(), key=lambda item: item[1])
        with_draft = " with the draft model loaded" if loads_draft else ""
        reason = (f"budget {format_bytes(budget_bytes)} is below the minimum "
                  f"{format_bytes(minimum.peak_bytes, round_up=True)}{with_draft}; "
                  f"biggest term: {_label(name)} {format_bytes(size)}")
        return Plan(False, budget_bytes, minimum.terms, None, minimum.peak_bytes, 0.0, [],
                    minimum.peak_bytes, keep, reason + _quantized_target_hint(budget_bytes, target, draft, workload,
                                                                              kind, repack), loads_draft)
    chosen, best = _best(candidates, budget_bytes), _best(candidates, UNLIMITED)
    reason = ""
    with_draft_model = [c.tokens_per_second for c in candidates if c.settings.drafter == "model"]
    if with_draft_model and best.settings.drafter != "model":  # none where a fixed γ of 0 drafts nothing
        model_speed = max(with_draft_model)
        where = "this machine's measured costs" if costs is not None else "this device's reference costs"
        reason = (f"the draft model does not pay on {where}, so it is not loaded: with it at most {model_speed:.1f} tok/s, "
                  f"without it {best.tokens_per_second:.1f} tok/s "
                  f"({'plain' if best.settings.drafter == 'none' else 'n-gram'} decoding)")
    return Plan(True, budget_bytes, chosen.terms, chosen.settings, chosen.peak_bytes, chosen.tokens_per_second,
                degradations_from(chosen, best), minimum.peak_bytes, keep, reason,
                min_budget_loads_draft=loads_draft)


def _quantized_target_hint(budget_bytes: int, target: ModelShape, draft: ModelShape | None, workload: Workload,
                           device_kind: str, repack: tuple[bool, ...]) -> str:
    """Where a quantized target KV cache would fit, the refusal says so: the user's choice to make."""
    lighter = QUANTIZED_TARGET_KV[QUANTIZED_TARGET_KV.index(workload.target_kv_type) + 1:] \
        if workload.target_kv_type in QUANTIZED_TARGET_KV else QUANTIZED_TARGET_KV
    for kv_type in lighter:
        needed = min_budget_any(target, replace(workload, target_kv_type=kv_type), device_kind, repack, draft)
        if needed <= budget_bytes:
            return (f"; --kv-type {kv_type} would fit in {format_bytes(needed, round_up=True)} "
                    f"(a quantized target KV cache: the output can differ from {workload.target_kv_type})")
    return ""


def generation_bytes(plan_terms: dict[str, int]) -> int:
    """Everything but the runtime and the models themselves: KV, compute, logits, probabilities."""
    return sum(v for k, v in plan_terms.items() if not k.endswith(_MODEL_TERMS))


def naive_generation_terms(target: ModelShape, draft: ModelShape | None, workload: Workload,
                           n_batch: int = N_BATCH) -> dict[str, int]:
    """What llama-cpp-python allocates for speculation with its defaults: full-context f16 KV for
    both models, n_outputs_max = n_batch, and logits_all=True on the target (n_ctx x vocab scores)."""
    n_ctx = workload.max_context
    found = {
        "target_kv_cache": terms.kv_cache_bytes(target, n_ctx),
        "target_logits": terms.output_buffer_bytes(target, n_batch),
        "target_scores": terms.logits_all_bytes(target, n_ctx),
        "target_compute": terms.compute_buffer_bytes(target, n_batch, n_ctx, n_batch),
    }
    if draft is not None:
        found.update({
            "draft_kv_cache": terms.kv_cache_bytes(draft, n_ctx),
            "draft_logits": terms.output_buffer_bytes(draft, 1),
            "draft_scores": terms.logits_all_bytes(draft, n_batch),  # `scores` is n_batch rows without logits_all
            "draft_compute": terms.compute_buffer_bytes(draft, n_batch, n_ctx, n_batch),
        })
    return found


def naive_generation_bytes(target: ModelShape, draft: ModelShape | None, workload: Workload,
                           n_batch: int = N_BATCH) -> int:
    return sum(naive_generation_terms(target, draft, workload, n_batch).values())
