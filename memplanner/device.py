"""The device a plan runs on, and how much memory it has free right now.

torch is imported lazily and only here, so memplanner stays importable without it. A device
is named as on the command line (cpu, cuda:1, rocm:0); its kind and ordinal come from the name.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


def is_gpu(device: str) -> bool:
    """cuda[:N] and rocm[:N] are GPUs; cpu and cpu:N (devices simulated on one CPU) are not."""
    return not device.startswith("cpu")


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" | "cuda" (ROCm builds use CUDA's terms)
    name: str
    total_bytes: int | None
    free_bytes: int | None  # None: this process cannot read it (torch without CUDA beside a CUDA llama.cpp)


def cpu_device() -> DeviceInfo:
    """Host memory; `available` counts reclaimable page cache, as an mmapped model can use it."""
    memory = psutil.virtual_memory()
    return DeviceInfo("cpu", f"{psutil.cpu_count(logical=True)}-core CPU", memory.total, memory.available)


def _cuda_memory(ordinal: int) -> tuple[int, int, str] | None:
    """(free, total, name) of GPU `ordinal` as torch sees it, or None."""
    try:
        import torch  # lazy: only device detection may touch torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or ordinal >= torch.cuda.device_count():
        return None
    free_bytes, total_bytes = torch.cuda.mem_get_info(ordinal)
    return int(free_bytes), int(total_bytes), torch.cuda.get_device_name(ordinal)


def read_device(name: str) -> DeviceInfo:
    """The named device now: `cpu[:N]` is the host; `cuda[:N]` / `rocm[:N]` GPU N, read through torch."""
    if name.startswith("cpu"):
        return cpu_device()
    _, _, index = name.partition(":")
    found = _cuda_memory(int(index or 0))
    if found is None:
        return DeviceInfo("cuda", name, None, None)
    free_bytes, total_bytes, model = found
    return DeviceInfo("cuda", f"{name} ({model})", total_bytes, free_bytes)


def detect_device(prefer_gpu: bool = True) -> DeviceInfo:
    """GPU 0 when torch sees one (and prefer_gpu), else the CPU."""
    found = _cuda_memory(0) if prefer_gpu else None
    if found is None:
        return cpu_device()
    free_bytes, total_bytes, model = found
    return DeviceInfo("cuda", model, total_bytes, free_bytes)
