"""What a front end asks a session for, in the user's own terms, and the runtime settings it makes.

generate, chat, bench's workers and the server fill one SessionSettings from their flags or
requests; `settings_for` turns it into the runtime's dataclasses (pocketspec/settings.py),
so every front end reaches the same engine the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping

from memplanner.memory_budget import MemoryBudget, parse_memory_budget
from memplanner.onnx_sizes import resolve_onnx_format
from memplanner.split import parse_devices
from pocketspec.atomic_file import check_output_folder, refuse_output_onto_inputs
from pocketspec.speculation.draft_limits import requested_draft_limits
from pocketspec.errors import UserError
from pocketspec.loader import ModelChoice, choose_models, trained_context_limit
from pocketspec.onnx_model.export import check_onnx_weights
from pocketspec.settings import GenerationSettings, ModelSettings, SamplingSettings, SpeculationSettings

MODEL = ModelSettings()
SPECULATION = SpeculationSettings()
GENERATION = GenerationSettings()
_MODEL_FIELDS = {field_.name for field_ in fields(ModelSettings)}
TORCH_ONLY_FIELDS = ("device", "weights", "torch_kv_type", "compile", "decode_step")
ONNX_ONLY_FIELDS = ("execution_provider", "prepack_weights")
# The fields each backend does not read: a flag that sets one is refused rather than ignored
NOT_READ_BY = {"llama.cpp": TORCH_ONLY_FIELDS + ONNX_ONLY_FIELDS, "torch": ONNX_ONLY_FIELDS,
               "onnx": tuple(name for name in TORCH_ONLY_FIELDS if name != "weights")}
FLAG_NAMES = {"execution_provider": "--ep"}
# The self-draft flags, by field, and the one --draft that reads each: a flag no drafter reads is refused
SELF_DRAFT_FIELDS = {"self_draft_window": "self-sparse", "self_draft_kv_type": "self-sparse",
                     "self_draft_keys": "self-sparse", "self_skip_layers": "self-skip"}


@dataclass(frozen=True)
class SessionSettings:
    target: str | None = None  # catalog name or GGUF path; None: the pair's
    draft: str | None = None  # catalog name, GGUF path, or a draftless / self-draft mode
    pair: str | None = None
    sampling: SamplingSettings = SamplingSettings()
    gamma: int | None = None  # None: adaptive
    memory_budget: str | None = None
    max_context: int | None = None  # None: ModelSettings' default, capped to the trained length
    kv_type: str | None = None  # the target's llama.cpp KV type; None: ModelSettings' default
    threads: int = 0
    max_new_tokens: int = GENERATION.max_new_tokens  # the longest generation the plan makes room for
    repack: bool | None = None  # None: the plan may choose
    exact_verify: bool | None = SPECULATION.exact_verify  # None: exact where it is free (verify_mode.py)
    # The other flags by field name (backend, device, devices as text, weights, torch_kv_type,
    # expected_acceptance, ...): each goes to its home, ModelSettings or SpeculationSettings.
    options: Mapping[str, object] = field(default_factory=dict)
    draft_window: int | None = None  # the draft model's KV cache in tokens; None: the plan's, else the target's
    pull_if_missing: bool = False
    # What the front end itself holds beside the models (a server: memplanner/server_terms.py), taken off a
    # whole-process --memory-budget: the models plan within what is left
    kept_bytes: int = 0
    # memory_budget parsed for the devices asked for, once, as the settings are made; None without one
    budget: MemoryBudget | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.memory_budget is not None:
            try:
                budget = parse_memory_budget(self.memory_budget, requested_devices(self))
            except ValueError as error:
                raise UserError(str(error)) from None
            if self.kept_bytes and not budget.per_device:
                budget = MemoryBudget(budget.total_bytes - self.kept_bytes)
            object.__setattr__(self, "budget", budget)


def repack_allowed(repack: bool | None) -> tuple[bool, ...]:
    """The weight layouts a plan may choose: the user's, or either when --repack/--no-repack is not given."""
    return (MODEL.repack_weights, not MODEL.repack_weights) if repack is None else (repack,)


def apply_backend_options(target_settings: ModelSettings, speculation: SpeculationSettings,
                          options: Mapping[str, object]) -> tuple[ModelSettings, SpeculationSettings]:
    """Put each backend option into the settings dataclass that is its home."""
    model_options = {name: value for name, value in options.items() if name in _MODEL_FIELDS}
    speculation_options = {name: value for name, value in options.items() if name not in _MODEL_FIELDS}
    model_options["devices"] = _parse_devices(model_options.get("devices"), model_options.get("device", MODEL.device))
    target_settings = replace(target_settings, **model_options)
    check_read_by(target_settings.backend, [name for name in NOT_READ_BY[target_settings.backend]
                                            if getattr(target_settings, name) != getattr(MODEL, name)])
    if target_settings.backend == "onnx":
        check_onnx_weights(resolve_onnx_format(target_settings.weights, target_settings.execution_provider))
        if target_settings.devices:
            raise UserError("--backend onnx runs on one device; leave --devices out (--ep picks the device)")
    return target_settings, replace(speculation, **speculation_options)


def check_read_by(backend: str, field_names) -> None:
    """Refuse the first of field_names (settings fields a front end was given) that `backend` does not read,
    rather than ignore it."""
    unread = [name for name in field_names if name in NOT_READ_BY[backend]]
    if unread:
        flag = flag_for(unread[0])
        owners = [owner for owner, unread_fields in NOT_READ_BY.items() if unread[0] not in unread_fields]
        raise UserError(f"{flag} applies to --backend {' or '.join(owners)}; add "
                        f"{' or '.join(f'--backend {owner}' for owner in owners)} or leave {flag} out")


def requested_devices(settings: SessionSettings) -> tuple[str, ...]:
    """The devices --devices lists (empty: one device), checked as every session checks them."""
    return _parse_devices(settings.options.get("devices"), settings.options.get("device", MODEL.device))


def _parse_devices(devices: str | tuple | None, device: str) -> tuple[str, ...]:
    if devices is None:
        return MODEL.devices
    if isinstance(devices, tuple):
        return devices
    if device != MODEL.device:
        raise UserError(f"give --device {device} or --devices {devices}, not both")
    try:
        return parse_devices(devices)
    except ValueError as error:
        raise UserError(f"--devices {devices}: {error}") from None


def check_output(output: Path, settings: SessionSettings, prompt_file: Path | None) -> None:
    """UserError for an --output that could never be written (its folder is missing) or that would write over an
    input (the prompt file, or a model the settings name: resolved, nothing loads), before a model loads for a
    minute."""
    check_output_folder(output, what="--output")  # first: it needs no model resolved
    models = choose_models(target=settings.target, draft=settings.draft, pair=settings.pair,
                           pull_if_missing=settings.pull_if_missing).files_read
    refuse_output_onto_inputs(output, [("--prompt-file", prompt_file), *models], flag="--output")


def settings_for(settings: SessionSettings) -> tuple[ModelChoice, ModelSettings, SpeculationSettings]:
    """The models the settings name, resolved and checked, and the runtime settings before any plan."""
    choice = choose_models(target=settings.target, draft=settings.draft, pair=settings.pair,
                           pull_if_missing=settings.pull_if_missing)
    target_settings = ModelSettings(
        num_threads=settings.threads,
        max_context=trained_context_limit(choice.target_path, settings.max_context, MODEL.max_context),
        kv_type=settings.kv_type or MODEL.kv_type,
        repack_weights=MODEL.repack_weights if settings.repack is None else settings.repack,
    )
    speculation = replace(SPECULATION, gamma=settings.gamma, exact_verify=settings.exact_verify)
    target_settings, speculation = apply_backend_options(target_settings, speculation, settings.options)
    if target_settings.backend != "llama.cpp" and settings.kv_type is not None:
        instead = "use --torch-kv-type" if target_settings.backend == "torch" else \
            "ONNX Runtime keeps it in the precision of --weights; leave it out"
        raise UserError(f"--kv-type {settings.kv_type} sets llama.cpp's KV cache; with --backend "
                        f"{target_settings.backend} {instead}")
    check_self_draft_flags(speculation, (choice.drafter,))
    return choice, with_verify_width(target_settings, speculation, choice), speculation


def flag_for(field_name: str) -> str:
    """The command-line flag that sets a settings field: --self-draft-window for self_draft_window."""
    return FLAG_NAMES.get(field_name, "--" + field_name.replace("_", "-"))


def check_self_draft_flags(speculation: SpeculationSettings, drafters: tuple[str, ...],
                           how_to_add: str = "--draft {drafter}") -> None:
    """Refuse a self-draft flag that none of `drafters` (those that will run) reads, rather than ignore it;
    how_to_add: how the command asks for the drafter that reads it (bench: "{drafter} to --drafters")."""
    for name, drafter in SELF_DRAFT_FIELDS.items():
        if getattr(speculation, name) != getattr(SPECULATION, name) and drafter not in drafters:
            flag = flag_for(name)
            raise UserError(f"{flag} applies to --draft {drafter} (--backend torch); add "
                            f"{how_to_add.format(drafter=drafter)} or leave {flag} out")


def options_read_by(drafter: str, options: Mapping[str, object]) -> dict[str, object]:
    """`options` without the self-draft flags that `drafter` does not read (a bench passes its flags to
    every drafter it runs)."""
    return {name: value for name, value in options.items()
            if name not in SELF_DRAFT_FIELDS or SELF_DRAFT_FIELDS[name] == drafter}


def with_verify_width(target_settings: ModelSettings, speculation: SpeculationSettings,
                      choice: ModelChoice) -> ModelSettings:
    """The target's logits rows: the widest verify these settings ask for (a draftless drafter's is wider)."""
    return replace(target_settings, max_logits_rows=requested_draft_limits(
        speculation, choice.drafter != "none").verify_width)
