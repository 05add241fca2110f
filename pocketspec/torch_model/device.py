"""Which torch device `--device cpu|cuda|cuda:N|rocm` means here, which GPU build torch is, and
which 2-byte float a GPU computes in.

ROCm builds of torch report their GPUs as `cuda` devices; torch.version.hip tells them apart.
"""

from __future__ import annotations

import torch

from pocketspec.errors import UserError


def gpu_build() -> str:
    """'rocm <version>', 'cuda <version>' or 'cpu-only'."""
    if getattr(torch.version, "hip", None):
        return f"rocm {torch.version.hip}"
    if torch.version.cuda:
        return f"cuda {torch.version.cuda}"
    return "cpu-only"


# AMD architectures with bf16 arithmetic (CDNA 1-4, RDNA 3-4); MI50 (gfx906) and older emulate it
NATIVE_BF16_ROCM_ARCHS = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def gpu_float_format(device: torch.device) -> str:
    """bf16 where the GPU computes in it natively, else fp16: CUDA before sm80 (T4, V100) and
    older AMD GPUs emulate bf16 several times slower. torch.cuda.is_bf16_supported() says True
    on every ROCm GPU, so the architecture decides there."""
    if getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(device).gcnArchName
        return "bf16" if arch.startswith(NATIVE_BF16_ROCM_ARCHS) else "fp16"
    return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"


def resolve_device(name: str, flag: str = "--device") -> torch.device:
    """cpu:N is the CPU: several of them simulate a multi-device split on one machine."""
    kind, _, index = name.partition(":")
    if index and not index.isdigit():
        raise UserError(f"{flag} {name!r}: use cpu, cuda, cuda:N or rocm")
    if kind == "cpu":
        return torch.device("cpu")
    if kind not in ("cuda", "rocm"):
        raise UserError(f"{flag} {name!r}: use cpu, cuda, cuda:N or rocm")
    if kind == "rocm" and not getattr(torch.version, "hip", None):
        raise UserError(f"{flag} {name}: this torch is a {gpu_build()} build; install a ROCm build of torch")
    if not torch.cuda.is_available():
        raise UserError(f"{flag} {name}: torch ({gpu_build()} build) sees no GPU; use "
                        + ("--device cpu" if flag == "--device" else "cpu:0,cpu:1 to simulate devices on the CPU"))
    ordinal = int(index or 0)
    if ordinal >= torch.cuda.device_count():
        raise UserError(f"{flag} {name}: torch sees {torch.cuda.device_count()} GPU(s), numbered from 0")
    return torch.device("cuda", ordinal)


def resolve_devices(names: tuple[str, ...]) -> list[torch.device]:
    """--devices: each resolved; all of one kind, since a CPU and a GPU compute in different dtypes."""
    devices = [resolve_device(name, "--devices") for name in names]
    if len({device.type for device in devices}) > 1:
        raise UserError(f"--devices {','.join(names)} mixes a CPU with GPUs: the torch backend splits over "
                        "devices of one kind")
    return devices


def torch_report() -> dict:
    """For `pocketspec doctor`: torch's version, its GPU build and the GPUs it sees."""
    report = {"version": torch.__version__, "build": gpu_build(), "devices": []}
    try:
        if torch.cuda.is_available():
            report["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except RuntimeError as error:  # a driver mismatch surfaces here, not at import
        report["error"] = str(error)
    return report
