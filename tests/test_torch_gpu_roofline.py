"""benchmarks/torch_gpu_roofline.py: its random models are built without a float32 copy on the way.

On a CPU, untouched pages never reach RSS, so the copy is seen by counting what every tensor-creating
op allocates (a dispatch mode), as a GPU's cudaMalloc would."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import torch_gpu_roofline as roofline  # noqa: E402

FACTORIES = ("empty", "empty_like", "empty_strided", "_to_copy", "zeros", "zeros_like")


class AllocatedBytes(TorchDispatchMode):
    """Sums the bytes of every tensor a factory or copy op creates on a real device (meta holds no memory)."""

    def __init__(self):
        super().__init__()
        self.num_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        found = func(*args, **(kwargs or {}))
        if (func.__name__.split(".")[0] in FACTORIES and isinstance(found, torch.Tensor)
                and found.device.type != "meta"):
            self.num_bytes += found.numel() * found.element_size()
        return found


def test_a_bf16_random_model_allocates_its_own_size_only():
    """Materialising fp32 and then casting allocated the model three times over (fp32, then bf16 copies),
    and on a GPU peaked at 1.5x the fp32 model."""
    config = roofline.ModelConfig("llama", 2, 256, 4, 4, 64, 512, 4000, 10000.0, 1e-5, False, True)
    with AllocatedBytes() as counter:
        model = roofline.random_model(config, "bf16", torch.device("cpu"))
    model_bytes = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    assert all(parameter.dtype == torch.bfloat16 for parameter in model.parameters())
    assert model_bytes <= counter.num_bytes < 1.2 * model_bytes
