"""The device a plan runs on, and how much memory it has free right now.

torch is imported lazily and only here, so memplanner stays importable without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


def is_gpu(device: str) -> bool:
    """cuda[:N] and rocm[:N] are GPUs; cpu and cpu:N (devices simulated on one CPU) are not."""
    return not device.startswith("cpu")


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" | "cuda"
    name: str
    total_bytes: int
    free_bytes: int


def cpu_device() -> DeviceInfo:
    """Host memory; `available` counts reclaimable page cache, as an mmapped model can use it."""
    memory = psutil.virtual_memory()
    return DeviceInfo("cpu", f"{psutil.cpu_count(logical=True)}-core CPU", memory.total, memory.available)


def _cuda_device() -> DeviceInfo | None:
    try:
        import torch  # lazy: only device detection may touch torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    free_bytes, total_bytes = torch.cuda.mem_get_info()
    return DeviceInfo("cuda", torch.cuda.get_device_name(), int(total_bytes), int(free_bytes))


def detect_device(prefer_gpu: bool = True) -> DeviceInfo:
    """The CUDA device when torch sees one (and prefer_gpu), else the CPU."""
    return (_cuda_device() if prefer_gpu else None) or cpu_device()
