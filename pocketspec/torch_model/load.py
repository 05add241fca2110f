"""Building the torch model on the meta device and materialising each tensor on the target device.

Large tensors arrive as chunks of float32 rows (gguf_weights.DEQUANTIZE_CHUNK_BYTES), and
each parameter is created once, directly in its final dtype, format and device, so the
weights are never held twice and loading needs only a chunk's worth of staging memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from memplanner.torch_sizes import WEIGHT_FORMATS, compute_format
from pocketspec.errors import UserError
from pocketspec.torch_model.device import gpu_float_format
from pocketspec.torch_model.glibc_heap import fix_mmap_threshold, release_freed_memory
from pocketspec.torch_model.model import Transformer, rope_inv_freq
from pocketspec.torch_model.onednn_caches import bound_onednn_caches
from pocketspec.torch_model.quantize import FLOAT_DTYPES, Int4Linear, Int8Linear, swap_linears


def compute_dtype(weights_format: str, device: torch.device) -> torch.dtype:
    """The dtype activations run in (memplanner.torch_sizes.compute_format); on a GPU the GPU's own
    2-byte float (device.gpu_float_format) where the format is int8/int4."""
    if weights_format in FLOAT_DTYPES or device.type == "cpu":
        return FLOAT_DTYPES[compute_format(weights_format, on_gpu=device.type != "cpu")]
    return FLOAT_DTYPES[gpu_float_format(device)]


def open_weights(path: Path | str):
    """A GGUF file or a Hugging Face directory (config.json + *.safetensors)."""
    path = Path(path)
    if path.is_dir():
        from pocketspec.torch_model.hf_weights import HFWeights

        return HFWeights(path)
    from pocketspec.torch_model.gguf_weights import GGUFWeights

    return GGUFWeights(path)


def _as_tensor(rows: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(rows, torch.Tensor):
        return rows
    if not rows.flags.writeable:
        rows = rows.copy()  # float32 rows read straight from the memory map
    return torch.from_numpy(rows)


def _place(model: nn.Module, name: str, shape: tuple[int, ...], chunks, dtype: torch.dtype,
           device: torch.device) -> None:
    """Create parameter `name` on `device` from its row chunks, in its final dtype and format."""
    module_path, _, attribute = name.rpartition(".")
    module = model.get_submodule(module_path)
    if isinstance(module, (Int8Linear, Int4Linear)) and attribute == "weight":
        module.materialize(device)
        for start, rows in chunks:
            module.load_rows(start, _as_tensor(rows).to(device=device, dtype=torch.float32))
        module.pack()
        return
    expected = getattr(module, attribute).shape
    if tuple(expected) != tuple(shape):
        raise UserError(f"tensor {name} has shape {tuple(shape)}, the model expects {tuple(expected)}")
    first_start, first_rows = next(chunks)
    if len(first_rows) == shape[0]:  # one chunk: on the CPU in fp32 it becomes the parameter, uncopied
        tensor = _as_tensor(first_rows).to(device=device, dtype=dtype)
    else:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        tensor[first_start:first_start + len(first_rows)] = _as_tensor(first_rows)
        for start, rows in chunks:
            tensor[start:start + len(rows)] = _as_tensor(rows)
    setattr(module, attribute, nn.Parameter(tensor, requires_grad=False))


def _cut(shard, name: str, shape: tuple[int, ...], chunks):
    """This rank's slice of a tensor as one chunk. Only block tensors are sliced, and they are
    small beside the embedding, so they are gathered whole first."""
    if not name.startswith("layers."):
        return shape, chunks
    pieces = [rows for _, rows in chunks]
    whole = pieces[0] if len(pieces) == 1 else (
        torch.cat(pieces) if isinstance(pieces[0], torch.Tensor) else np.concatenate(pieces))
    piece = shard.cut(name, whole)
    return tuple(piece.shape), iter([(0, piece)])


def load_model(path: Path | str, weights_format: str, device: torch.device,
               device_for: Callable[[str], torch.device] | None = None, shard=None) -> Transformer:
    """device_for(parameter name) places each tensor (a layer split); None puts all on `device`.

    shard: a tensor_parallel.TensorShard; the model is resized to it and each tensor cut as read.
    """
    if weights_format not in WEIGHT_FORMATS:
        raise UserError(f"unknown weights format {weights_format!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    weights = open_weights(path)
    dtype = compute_dtype(weights_format, device)
    if device.type == "cpu":
        bound_onednn_caches()
        fix_mmap_threshold()
    with torch.device("meta"):
        model = Transformer(weights.config)
        swap_linears(model, weights_format, dtype)
        if shard is not None:
            shard.resize(model)
    try:
        for name, shape, chunks in weights.tensors():
            if shard is not None:
                shape, chunks = _cut(shard, name, shape, chunks)
            _place(model, name, shape, chunks, dtype, device if device_for is None else device_for(name))
            release_freed_memory()
    finally:
        weights.close()
    model.inv_freq = rope_inv_freq(weights.config, device)
    missing = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if missing:
        raise UserError(f"{path} lacks tensors the model needs, e.g. {missing[0]} ({len(missing)} in all)")
    return model.eval()
