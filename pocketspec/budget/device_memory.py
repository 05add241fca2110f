"""How much memory a device has free now, for the planner: the host through psutil (memplanner), a GPU
through torch, which sees CUDA and ROCm devices alike."""

from __future__ import annotations

from memplanner.device import DeviceInfo, cpu_device


def _gpu_memory(ordinal: int) -> tuple[int, int, str] | None:
    """(free, total, name) of GPU `ordinal` as torch sees it, or None."""
    try:
        import torch  # lazy: a CPU-only run never imports it for planning
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
    found = _gpu_memory(int(index or 0))
    if found is None:
        return DeviceInfo("cuda", name, None, None)
    free_bytes, total_bytes, model = found
    return DeviceInfo("cuda", f"{name} ({model})", total_bytes, free_bytes)

