"""The settings a plan can choose, every candidate worth considering, and the bytes each needs.

Lossless by construction: every candidate runs the target exactly as the user set it (its
weights and the KV type of Workload.target_kv_type), so a plan never changes the target's
output. Only the draft side is traded for memory: the draft's KV type, its window and γ,
which move the acceptance rate and speed, never the tokens.

A candidate is scored by predicted tokens/s first; among equally fast ones the planner
prefers, in order, a longer draft window, f16 draft KV over quantized draft KV, a larger
n_ubatch, and then less memory. So as a budget shrinks the planner gives up, in this order:
n_ubatch (only prompt speed), the draft's f16 KV, the draft window, then speed itself
(shorter gamma, n-gram drafting, plain decoding) as far as the step-cost model says; a draft
model the user named (Workload.keeps_draft_model) is never given up, the budget is refused instead.
Not repacking the weights for llama.cpp's CPU kernels is chosen only where the faster plans do
not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memplanner import terms
from memplanner.costs import CPU_REFERENCES, tokens_per_second
from memplanner.defaults import ATTENTION_SINK_TOKENS, MAX_DRAFTLESS_GAMMA, MAX_GAMMA, MAX_NEW_TOKENS
from memplanner.shapes import ModelShape

UBATCH_CHOICES = (512, 256, 128, 64)
DRAFT_CONTEXT_CHOICES = (2048, 1024, 512, 256)  # besides the full context
DRAFT_KV_PREFERENCE = ("f16", "q8_0", "q4_0")  # the draft's KV precision moves only its acceptance, best first
DRAFTER_UPSIDE = {"ngram": 2, "none": 1, "model": 0}  # at equal speed: see Candidate.preference


@dataclass(frozen=True)
class Workload:
    max_context: int  # prompt + generated tokens per sequence
    max_new_tokens: int = MAX_NEW_TOKENS
    batch_size: int = 1
    # sequences that share max_context in one llama.cpp context (a server's, --batch): each adds its logits rows
    num_sequences: int = 1
    max_gamma: int = MAX_GAMMA  # a draft model's longest draft
    temperature: float = 0.0
    target_kv_type: str = "f16"  # the user's --kv-type: the plan never changes it
    # a draftless proposal's longest: its tokens cost nothing to draft, only verify rows (0: none)
    max_draftless_gamma: int = MAX_DRAFTLESS_GAMMA
    # the user named the draft model (--draft NAME): plan only configurations that load it, never
    # n-gram or plain decoding in its place, however little it pays (unless max_gamma is 0: it cannot draft)
    keeps_draft_model: bool = False

    @property
    def plans_draft_model_only(self) -> bool:
        """Every candidate with a draft model loads it (the planner's rule for keeps_draft_model)."""
        return self.keeps_draft_model and self.max_gamma > 0


@dataclass(frozen=True)
class PlanSettings:
    drafter: str  # "model" | "ngram" | "none"
    max_gamma: int  # 0 for plain decoding; the draft model's γ, or the n-gram drafter's
    target_n_ctx: int  # KV cells, already a multiple of 256 as llama.cpp would pad it
    target_kv_type: str  # the user's, always (quantized V needs flash attention: "auto" gives it on CPU)
    draft_n_ctx: int  # 0 without a draft model
    draft_kv_window: int  # tokens the draft keeps: sinks + recent; == max_context when full
    n_batch: int
    n_ubatch: int
    logits_rows: int  # n_outputs_max for the target: the widest verify (a draft model's pair drafts n-grams too)
    batch_size: int
    target_device: str
    draft_device: str
    flash_attn: str = "auto"  # llama.cpp resolves auto to enabled on CPU (observed)
    repack_weights: bool = True  # llama.cpp CPU repack copies, for target and draft alike
    draft_kv_type: str = "f16"  # f16 | q8_0 | q4_0: the planner's to choose


@dataclass(frozen=True)
class Candidate:
    settings: PlanSettings
    terms: dict
    peak_bytes: int
    tokens_per_second: float

    @property
    def preference(self) -> tuple:
        """Larger is better: speed, drafter upside, draft window, f16 draft KV, γ, n_ubatch, repack, less memory.

        At equal predicted speed the n-gram drafter beats plain decoding: the runtime's
        controller falls back to γ = 0 by itself, so drafting can only gain, for a few KiB.
        A draft model at no predicted gain is last: it costs its weights.
        """
        s = self.settings
        return (round(self.tokens_per_second, 9), DRAFTER_UPSIDE[s.drafter], s.draft_kv_window,
                -DRAFT_KV_PREFERENCE.index(s.draft_kv_type), s.max_gamma, s.n_ubatch, s.repack_weights,
                -self.peak_bytes)


def settings_terms(settings: PlanSettings, target: ModelShape, draft: ModelShape | None,
                   workload: Workload) -> dict[str, int]:
    """Every memory term of one configuration, in bytes (zero terms left out)."""
    s, batch = settings, settings.batch_size
    device = s.target_device
    found = {
        "process_base": terms.process_base_bytes(device),
        "huge_page_rounding": terms.huge_page_rounding_bytes(device),
        "runtime_overhead": terms.runtime_overhead_bytes(device),
        "working_set": terms.working_set_bytes(workload.max_context) * batch,
        "target_weights": terms.resident_weights_bytes(target, device, s.repack_weights),
        "target_repacked_weights": terms.repacked_weights_bytes(target, device) if s.repack_weights else 0,
        "target_metadata": terms.model_metadata_bytes(target),
        "target_kv_cache": terms.kv_cache_bytes(target, s.target_n_ctx, s.target_kv_type, num_seqs=batch),
        "target_logits": terms.output_buffer_bytes(target, s.logits_rows * batch),
        "target_compute": terms.compute_buffer_bytes(target, s.n_ubatch, s.target_n_ctx, s.logits_rows * batch),
        "target_probs": batch * terms.target_probs_bytes(target, s.logits_rows - 1, workload.temperature),
    }
    if workload.num_sequences > 1:
        found["sequences_logits"] = terms.sequences_logits_bytes(target, workload.num_sequences, s.logits_rows)
    if s.drafter != "none":  # a draft model's runtime drafts n-grams beside it (drafter auto)
        found["ngram_index"] = batch * terms.ngram_index_bytes(workload.max_context)
        found["ngram_corpus"] = terms.ngram_corpus_bytes()
    if s.drafter == "model":
        draft_device = s.draft_device
        found.update({
            "draft_weights": terms.resident_weights_bytes(draft, draft_device, s.repack_weights),
            "draft_repacked_weights": terms.repacked_weights_bytes(draft, draft_device) if s.repack_weights else 0,
            "draft_metadata": terms.model_metadata_bytes(draft),
            "draft_kv_cache": terms.kv_cache_bytes(draft, s.draft_n_ctx, s.draft_kv_type, num_seqs=batch),
            "draft_logits": terms.output_buffer_bytes(draft, batch),
            "draft_compute": terms.compute_buffer_bytes(draft, s.n_ubatch, s.draft_n_ctx, batch),
        })
    return {name: int(value) for name, value in found.items() if value}


def repack_choices(target: ModelShape, draft: ModelShape | None, device_kind: str,
                   allowed: tuple[bool, ...] = (True, False)) -> tuple[bool, ...]:
    """Repacking is a choice only on CPU for models that have repackable weights."""
    has_repackable = target.repacked_bytes or (draft is not None and draft.repacked_bytes)
    return allowed if device_kind == "cpu" and has_repackable else allowed[:1]


def candidate_settings(target: ModelShape, draft: ModelShape | None, workload: Workload,
                       device_kind: str = "cpu", repack: tuple[bool, ...] = (True, False)):
    """Every configuration considered: repack x drafter x gamma x draft KV type x draft window x n_ubatch,
    all with the target's KV type as the user set it."""
    for repack_weights in repack_choices(target, draft, device_kind, repack):
        for settings in _candidate_settings(target, draft, workload, device_kind):
            yield replace(settings, repack_weights=repack_weights)


def draftless_gammas(ceiling: int) -> list[int]:
    """The n-gram ceilings worth planning: verify widths of powers of two (the tiles batched kernels
    run: llama.cpp's CPU gemm takes 4 and 16 rows at a time, so 16 rows cost less than 11) and
    the ceiling asked for. A proposal costs nothing to draft, so only the widest verify matters."""
    return sorted({width - 1 for width in (2, 4, 8, 16, 32) if width - 1 <= ceiling} | ({ceiling} if ceiling else set()))


def _candidate_settings(target: ModelShape, draft: ModelShape | None, workload: Workload, device_kind: str):
    common = dict(batch_size=workload.batch_size, target_device=device_kind, draft_device=device_kind)
    target_kv = workload.target_kv_type
    plain_ctx = terms.padded_context(workload.max_context)
    if draft is not None and workload.plans_draft_model_only:
        drafters = ["model"]
    else:
        for n_ubatch in UBATCH_CHOICES:
            yield PlanSettings("none", 0, plain_ctx, target_kv, 0, 0, n_ubatch, n_ubatch, 1, **common)
        drafters = ["ngram"] + (["model"] if draft is not None else [])
    for drafter in drafters:
        gammas = draftless_gammas(workload.max_draftless_gamma) if drafter == "ngram" else \
            range(1, workload.max_gamma + 1)
        for gamma in gammas:
            # beside a draft model the runtime also verifies n-gram proposals, up to their own γ
            verify_rows = 1 + (gamma if drafter == "ngram" else max(gamma, workload.max_draftless_gamma))
            target_ctx = plain_ctx  # a step's γ shrinks to the room left: no verify cells past the context
            windows, draft_kv_types = [(0, 0)], DRAFT_KV_PREFERENCE[:1]
            if drafter == "model":
                draft_kv_types = DRAFT_KV_PREFERENCE
                windows = [(target_ctx, workload.max_context)]
                windows += [(ctx, ctx - gamma - 1) for ctx in DRAFT_CONTEXT_CHOICES
                            if ctx - gamma - 1 < workload.max_context and ctx - gamma - 1 > 4 * ATTENTION_SINK_TOKENS]
            for draft_kv in draft_kv_types:
                for draft_ctx, window in windows:
                    for n_ubatch in UBATCH_CHOICES:
                        yield PlanSettings(drafter, gamma, target_ctx, target_kv, draft_ctx, window,
                                           n_ubatch, n_ubatch, verify_rows, draft_kv_type=draft_kv, **common)


def evaluate(settings: PlanSettings, target: ModelShape, draft: ModelShape | None, workload: Workload,
             alpha: dict[str, float], references=CPU_REFERENCES) -> Candidate:
    found = settings_terms(settings, target, draft, workload)
    # max_gamma is a ceiling: the runtime picks γ per step from 0 (plain decoding) up to
    # it, so a candidate is predicted at its best γ within the ceiling.
    speed = max(tokens_per_second(target, draft, settings.drafter if gamma else "none", gamma,
                                  alpha.get(settings.drafter), references, settings.repack_weights)
                for gamma in range(settings.max_gamma + 1))
    return Candidate(settings, found, sum(found.values()), speed)
