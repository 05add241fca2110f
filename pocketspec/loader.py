"""From user-facing names (catalog name, GGUF path, `ngram`, `none`) to a ready engine."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pocketspec.backends.torch_open import SELF_DRAFTS, check_self_draft, open_backend, open_self_draft
from pocketspec.catalog import resolve_model, resolve_pair
from pocketspec.errors import UserError
from pocketspec.gguf_check import check_gguf, check_same_vocab
from pocketspec.settings import ModelSettings, SamplingSettings, SpeculationSettings

DRAFTLESS = ("ngram", "none")


@dataclass(frozen=True)
class ModelChoice:
    """Resolved files: the target GGUF, and a draft GGUF or a draftless mode."""

    target_path: Path
    draft_path: Path | None
    drafter: str  # auto | ngram | none | self-sparse | self-skip  (auto: the controller mixes n-gram and draft model)


def choose_models(
    *, target: str | None, draft: str | None, pair: str | None, pull_if_missing: bool = False
) -> ModelChoice:
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
    return ModelChoice(target_path, draft_path, "auto")


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


def draft_settings_for(target_settings: ModelSettings, draft_max_context: int | None = None,
                       draft_device: str | None = None) -> ModelSettings:
    """The draft follows the target's context unless the plan gives it a shorter window.

    It keeps an f16 KV cache and one logits row: it only ever reads its last position. When the
    target is split over several devices, the draft runs whole on one: the plan's choice, else the first.
    """
    devices = (draft_device or target_settings.devices[0],) if target_settings.devices else ()
    return replace(target_settings, max_context=draft_max_context or target_settings.max_context,
                   kv_type="f16", max_logits_rows=1, devices=devices, layers_per_device=())


def load_engine(
    choice: ModelChoice,
    *,
    target_settings: ModelSettings,
    draft_settings: ModelSettings | None = None,
    sampling: SamplingSettings = SamplingSettings(),
    speculation: SpeculationSettings = SpeculationSettings(),
):
    """Load the backends and build the engine; the caller closes it with close_engine."""
    from pocketspec.engine import SpeculativeEngine

    is_self_draft = choice.drafter in SELF_DRAFTS
    if speculation.drafter == "auto" and choice.drafter not in ("auto", *SELF_DRAFTS):
        speculation = replace(speculation, drafter=choice.drafter)
    if speculation.drafter == "model" and choice.draft_path is None and not is_self_draft:
        raise UserError("--drafter model needs a draft model: pass --draft NAME or --pair NAME")
    if is_self_draft:
        check_self_draft(choice.drafter, target_settings, speculation)
    target_backend = open_backend(choice.target_path, target_settings)
    draft_backend = None
    try:
        if is_self_draft and speculation.drafter in ("auto", "model"):
            draft_backend = open_self_draft(target_backend, choice.drafter, target_settings, speculation)
        elif choice.draft_path is not None and speculation.drafter in ("auto", "model"):
            draft_backend = open_backend(choice.draft_path, draft_settings or target_settings)
        return SpeculativeEngine(target_backend, draft_backend=draft_backend, sampling=sampling, speculation=speculation)
    except BaseException:
        if draft_backend is not None:
            draft_backend.close()
        target_backend.close()
        raise


def close_engine(engine) -> None:
    if engine.model is not None:
        engine.model.close()
    engine.target.close()
