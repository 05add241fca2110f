"""Building the torch model on the meta device and materialising each tensor on the target device.

Only one float32 tensor is in flight at a time (dequantized or read from disk), and
each parameter is created once, directly in its final dtype, format and device, so
the weights are never held twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from pocketspec.errors import UserError
from pocketspec.torch_model.model import Transformer, rope_inv_freq
from pocketspec.torch_model.quantize import FLOAT_DTYPES, WEIGHT_FORMATS, Int4Linear, Int8Linear, swap_linears


def compute_dtype(weights_format: str, device: torch.device) -> torch.dtype:
    """The dtype activations run in: the weights' own float type; int8/int4 run in fp32 on CPU, bf16 on GPU."""
    if weights_format in FLOAT_DTYPES:
        return FLOAT_DTYPES[weights_format]
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def open_weights(path: Path | str):
    """A GGUF file or a Hugging Face directory (config.json + *.safetensors)."""
    path = Path(path)
    if path.is_dir():
        from pocketspec.torch_model.hf_weights import HFWeights

        return HFWeights(path)
    from pocketspec.torch_model.gguf_weights import GGUFWeights

    return GGUFWeights(path)


def _place(model: nn.Module, name: str, array: np.ndarray | torch.Tensor, dtype: torch.dtype,
           device: torch.device) -> None:
    module_path, _, attribute = name.rpartition(".")
    module = model.get_submodule(module_path)
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        array = array.copy()  # a float32 tensor read straight from the memory map
    tensor = torch.from_numpy(array) if isinstance(array, np.ndarray) else array
    if isinstance(module, (Int8Linear, Int4Linear)) and attribute == "weight":
        module.load(tensor.to(device=device, dtype=torch.float32))
        return
    expected = getattr(module, attribute).shape
    if tuple(expected) != tuple(tensor.shape):
        raise UserError(f"tensor {name} has shape {tuple(tensor.shape)}, the model expects {tuple(expected)}")
    setattr(module, attribute, nn.Parameter(tensor.to(device=device, dtype=dtype), requires_grad=False))


def load_model(path: Path | str, weights_format: str, device: torch.device,
               device_for: Callable[[str], torch.device] | None = None, shard=None) -> Transformer:
    """device_for(parameter name) places each tensor (a layer split); None puts all on `device`.

    shard: a tensor_parallel.TensorShard; the model is resized to it and each tensor cut as read.
    """
    if weights_format not in WEIGHT_FORMATS:
        raise UserError(f"unknown weights format {weights_format!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    weights = open_weights(path)
    dtype = compute_dtype(weights_format, device)
    with torch.device("meta"):
        model = Transformer(weights.config)
        swap_linears(model, weights_format, dtype)
        if shard is not None:
            shard.resize(model)
    try:
        for name, array in weights.tensors():
            if shard is not None:
                array = shard.cut(name, array)
            _place(model, name, array, dtype, device if device_for is None else device_for(name))
    finally:
        weights.close()
    model.inv_freq = rope_inv_freq(weights.config, device)
    missing = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if missing:
        raise UserError(f"{path} lacks tensors the model needs, e.g. {missing[0]} ({len(missing)} in all)")
    return model.eval()
