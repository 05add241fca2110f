"""From user-facing names (catalog name, GGUF path, `ngram`, `none`) to a ready engine."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from memplanner.defaults import ACCEPTANCE_PRIORS, DRAFT_MODEL_MIN_SPEEDUP
from memplanner.measured_costs import MachineCosts, best_draft_model_speedup
from memplanner.shapes import shape_from_gguf
from pocketspec.backends.torch_open import check_self_draft, open_backend, open_self_draft
from pocketspec.calibrate import cached_costs, calibrated_costs
from pocketspec.models.catalog import load_catalog, resolve_pair
from pocketspec.models.model_files import resolve_model
from pocketspec.speculation.engine import SpeculativeEngine
from pocketspec.errors import UserError
from pocketspec.models.gguf_check import check_gguf, check_same_vocab
from pocketspec.settings import DRAFTLESS, SELF_DRAFTS, ModelSettings, SamplingSettings, SpeculationSettings


@dataclass(frozen=True)
class ModelChoice:
    """Resolved files: the target GGUF, and a draft GGUF or a draftless mode."""

    target_path: Path
    draft_path: Path | None
    drafter: str  # auto (a draft model: the controller mixes it with n-grams), or one of DRAFTLESS or SELF_DRAFTS
    draft_is_explicit: bool = False  # the user named the draft model (--draft), not only a pair

    @property
    def files_read(self) -> list[tuple[str, Path | None]]:
        """The model files a run reads, by the flags that name them (for refuse_output_onto_inputs)."""
        return [("--target", self.target_path), ("--draft", self.draft_path)]


def _what_to_give(flag: str) -> str:
    if flag == "--pair":
        return "one of " + ", ".join(sorted(load_catalog().pairs))
    if flag == "--draft":
        return f"a model name or path, or one of {', '.join((*DRAFTLESS, *SELF_DRAFTS))}"
    return "a model name or path"


def choose_models(
    *, target: str | None, draft: str | None, pair: str | None, pull_if_missing: bool = False
) -> ModelChoice:
    for flag, value in (("--target", target), ("--draft", draft), ("--pair", pair)):
        if value is not None and not value.strip():  # an unset shell variable: never a default in disguise
            raise UserError(f"{flag} is empty: give {_what_to_give(flag)}")
    draft_is_explicit = draft is not None
    if pair is not None or target is None:
        pair_entry = resolve_pair(pair)
        target = target or pair_entry.target
        draft = draft or pair_entry.draft
    target_path = resolve_model(target, pull_if_missing=pull_if_missing)
    target_info = check_gguf(target_path)
    draft = draft or "ngram"
    if draft in DRAFTLESS or draft in SELF_DRAFTS:
        return ModelChoice(target_path, None, draft)
    draft_path = resolve_model(draft, pull_if_missing=pull_if_missing)
    check_same_vocab(target_info, check_gguf(draft_path))
    return ModelChoice(target_path, draft_path, "auto", draft_is_explicit)


def trained_context_limit(target_path: Path, max_context: int | None, default: int) -> int:
    """The target's context: --max-context as given, else `default` capped to the trained length.

    A --max-context past the length the model was trained on is a UserError, the one `plan` gives.
    """
    trained = check_gguf(target_path).context_length or 0
    if max_context is None:
        return min(default, trained) if trained > 0 else default
    if max_context > trained > 0:
        raise UserError(f"--max-context {max_context} exceeds {Path(target_path).stem}'s trained context "
                        f"{trained}; lower it")
    return max_context


def load_engine(
    choice: ModelChoice,
    *,
    target_settings: ModelSettings,
    draft_settings: ModelSettings | None = None,
    sampling: SamplingSettings = SamplingSettings(),
    speculation: SpeculationSettings = SpeculationSettings(),
    notify=None,
):
    """Load the backends and build the engine; the caller closes it (engine.close()).

    notify(line): told before a first-time cost measurement, ONNX export or --exact-verify probe, which take
    seconds to minutes.
    """
    is_self_draft = choice.drafter in SELF_DRAFTS
    if speculation.drafter == "auto" and choice.drafter not in ("auto", *SELF_DRAFTS):
        speculation = replace(speculation, drafter=choice.drafter)
    if speculation.drafter == "model" and choice.draft_path is None and not is_self_draft:
        raise UserError("--drafter model needs a draft model: pass --draft NAME or --pair NAME")
    if is_self_draft:
        check_self_draft(choice.drafter, target_settings, speculation)
    target_backend = open_backend(choice.target_path, target_settings, notify)
    draft_backend = None
    try:
        target_costs = calibrated_for(target_backend, speculation, notify)
        draft_costs = skip_reason = None
        if is_self_draft and speculation.drafter in ("auto", "model"):
            draft_backend = open_self_draft(target_backend, choice.drafter, target_settings, speculation)
        elif choice.draft_path is not None and speculation.drafter in ("auto", "model"):
            draft_settings = draft_settings or target_settings
            skip_reason = draft_cannot_pay(choice, target_costs, draft_settings, speculation)
            if skip_reason is None:
                draft_backend = open_backend(choice.draft_path, draft_settings, notify)
                draft_costs = calibrated_for(draft_backend, speculation, notify)
        engine = SpeculativeEngine(target_backend, draft_backend=draft_backend, sampling=sampling,
                                   speculation=speculation, target_costs=target_costs, draft_costs=draft_costs,
                                   on_measure=notify)
        if skip_reason is not None:
            engine.notes.append(skip_reason)
        engine.notes.extend(target_backend.notes + (draft_backend.notes if draft_backend is not None else []))
        return engine
    except BaseException:
        if draft_backend is not None:
            draft_backend.close()
        target_backend.close()
        raise


def calibrated_for(backend, speculation: SpeculationSettings, notify):
    """This machine's cost table for an adaptive run (measured once, then cached); None when γ is fixed."""
    if speculation.drafter == "none" or speculation.gamma is not None or not hasattr(backend, "model_path"):
        return None
    return calibrated_costs(backend, min_width=backend.max_logits_rows, on_measure=notify)


def draft_cannot_pay(choice: ModelChoice, target_costs, draft_settings: ModelSettings,
                      speculation: SpeculationSettings) -> str | None:
    """Why a pair's draft model is not worth loading on this machine; None when it may pay or was asked for."""
    if target_costs is None or choice.draft_is_explicit or speculation.drafter == "model":
        return None
    draft_costs = cached_costs(choice.draft_path, draft_settings)
    if draft_costs is None:  # not measured yet: the target's curve scaled by weight bytes
        target_only = MachineCosts(((shape_from_gguf(choice.target_path), target_costs),))
        draft_costs = target_only.table_for(shape_from_gguf(choice.draft_path))
    speedup, _ = best_draft_model_speedup(target_costs, draft_costs, ACCEPTANCE_PRIORS["model"], speculation.max_gamma)
    if speedup >= DRAFT_MODEL_MIN_SPEEDUP:
        return None
    return (f"draft model {choice.draft_path.name} not loaded: on this machine's measured costs it would decode at "
            f"{speedup:.2f}x plain decoding at {ACCEPTANCE_PRIORS['model']:.0%} acceptance, under the "
            f"{DRAFT_MODEL_MIN_SPEEDUP:.2f}x that pays for loading it; pass --draft NAME to load it anyway")
