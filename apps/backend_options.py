"""Click options that pick the backend (`--backend torch --device cuda:1 --weights int8`) and size
the torch self-drafts; defaults come from pocketspec.settings, like every other flag."""

from __future__ import annotations

from dataclasses import fields, replace

import click

from apps.options import setting_option
from memplanner.defaults import ATTENTION_SINK_TOKENS
from memplanner.split import parse_devices
from memplanner.torch_sizes import AUTO, resolve_weights_format
from pocketspec.errors import UserError
from pocketspec.settings import TORCH_KV_TYPES, TORCH_WEIGHTS, ModelSettings, SpeculationSettings

MODEL = ModelSettings()
SPECULATION = SpeculationSettings()
_MODEL_FIELDS = {field.name for field in fields(ModelSettings)}


def backend_options(function):
    options = [
        click.option("--backend", type=click.Choice(["llama.cpp", "torch"]), default=MODEL.backend, show_default=True,
                     help="Inference backend: llama.cpp (GGUF, CPU/GPU builds) or torch (PyTorch; CPU, CUDA, ROCm)."),
        click.option("--device", default=MODEL.device, show_default=True, help="torch device: cpu, cuda, cuda:N or rocm."),
        click.option("--devices", default=",".join(MODEL.devices) or None,
                     help="Split the target over several devices, e.g. cuda:0,cuda:1 (cpu:0,cpu:1 simulates two on "
                          "one CPU); with --memory-budget 6GiB,4GiB (or cuda:0=6GiB,...) the plan gives each its "
                          "blocks and places the draft."),
        click.option("--split-mode", type=click.Choice(["layer", "row"]), default=MODEL.split_mode, show_default=True,
                     help="With --devices: layer gives each device a run of blocks; row splits every matrix over "
                          "them (tensor parallel; torch: one process per device, or run under torchrun)."),
        click.option("--weights", type=click.Choice(TORCH_WEIGHTS), default=MODEL.weights, show_default=True,
                     help=f"torch weight format (auto: {resolve_weights_format(AUTO, on_gpu=False)} on a CPU, "
                          f"{resolve_weights_format(AUTO, on_gpu=True)} on a GPU, fp16 where bf16 is emulated); "
                          "int8/int4 quantize on load."),
        click.option("--torch-kv-type", type=click.Choice(TORCH_KV_TYPES), default=MODEL.torch_kv_type,
                     show_default=True, help="torch KV cache dtype (auto: the weights' compute dtype)."),
        click.option("--compile/--no-compile", "compile", default=MODEL.compile, show_default=True,
                     help="torch.compile the torch model's forward (for GPUs)."),
        setting_option("--self-draft-window", SpeculationSettings, "self_draft_window", show_default=True,
                       help=f"--draft self-sparse: KV positions the draft keeps ({ATTENTION_SINK_TOKENS} sinks + recent)."),
        click.option("--self-draft-kv-type", type=click.Choice(TORCH_KV_TYPES), default=SPECULATION.self_draft_kv_type,
                     show_default=True, help="--draft self-sparse: the draft's KV dtype."),
        setting_option("--self-skip-layers", SpeculationSettings, "self_skip_layers",
                       show_default=True, help="--draft self-skip: first layers the draft runs (0: half)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def apply_backend_options(target_settings: ModelSettings, speculation: SpeculationSettings,
                          options: dict) -> tuple[ModelSettings, SpeculationSettings]:
    """Put each option into the settings dataclass that is its home."""
    model_options = {name: value for name, value in options.items() if name in _MODEL_FIELDS}
    speculation_options = {name: value for name, value in options.items() if name not in _MODEL_FIELDS}
    model_options["devices"] = _parse_devices(model_options.get("devices"), model_options.get("device", MODEL.device))
    target_settings = replace(target_settings, **model_options)
    if target_settings.backend == "llama.cpp":
        changed = [name for name in ("device", "weights", "torch_kv_type", "compile")
                   if getattr(target_settings, name) != getattr(MODEL, name)]
        if changed:
            flag = "--" + changed[0].replace("_", "-")
            raise UserError(f"{flag} applies to --backend torch; add --backend torch or leave {flag} out")
    return target_settings, replace(speculation, **speculation_options)


def _parse_devices(devices: str | None, device: str) -> tuple[str, ...]:
    if devices is None:
        return MODEL.devices
    if device != MODEL.device:
        raise UserError(f"give --device {device} or --devices {devices}, not both")
    try:
        return parse_devices(devices)
    except ValueError as error:
        raise UserError(f"--devices {devices}: {error}") from None
