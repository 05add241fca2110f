"""Refuses, before anything loads, a device or split the chosen backend cannot give.

A device that cannot be used is an error, never a silent fallback to the CPU: llama.cpp
built for the CPU alone would otherwise take `--devices cuda:0` and run on the CPU.
"""

from __future__ import annotations

from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings


def _check_llama_devices(devices: tuple[str, ...]) -> None:
    gpus = [device for device in devices if not device.startswith("cpu")]
    if not gpus:
        return
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        raise UserError(f"--devices {','.join(devices)}: this llama.cpp build runs on the CPU only; "
                        "rebuild it for your GPUs (POCKETSPEC_ACCEL=cuda|rocm|vulkan make setup) or use cpu:N")


def check_devices(settings: ModelSettings) -> None:
    """UserError unless every device of `settings` exists for its backend and the split mode fits them."""
    if settings.split_mode == "row" and len(settings.devices) < 2:
        raise UserError("--split-mode row splits every matrix over two or more --devices, e.g. cuda:0,cuda:1; "
                        "give them, or leave --split-mode out")
    if settings.decode_step == "static" and len(settings.devices) > 1:
        raise UserError("--decode-step static runs on one device; a model split over --devices decodes with the "
                        "dynamic step: leave --decode-step out")
    if settings.backend == "llama.cpp":
        _check_llama_devices(settings.devices)
    elif settings.backend == "onnx":
        from pocketspec.backends.onnx_backend import check_provider

        check_provider(settings.execution_provider)
    elif settings.backend == "torch" and settings.all_devices != ("cpu",):
        # the CPU needs no check: torch (180 MiB resident) is imported only once the memory plan has fitted
        from pocketspec.torch_model.device import resolve_device, resolve_devices

        if settings.devices:
            resolve_devices(settings.devices)
        else:
            resolve_device(settings.device)
