"""The device a plan runs on, and how much memory it has free: the host's read here, a GPU's read by the
runtime (pocketspec/budget/device_memory.py, through torch) and passed in, so memplanner never imports
torch. A device is named as on the command line (cpu, cuda:1, rocm:0); its kind and ordinal come from
the name.
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
