"""A static KV cache: one preallocated buffer per layer, indexed by position.

Buffers are [max_batch, num_kv_heads, max_context, head_dim] in the planned dtype and
never reallocated: rollback is a move of the backend's position, and a sliding window
(shift) moves keys and values down in place. Keys are stored after RoPE, so a shift
re-rotates the moved keys by -count positions (rotations compose). The int8 variant
keeps one float32 scale per (batch, head, position) for keys and values each. Under a
layer split each layer's buffers live on that layer's device.
"""

from __future__ import annotations

import torch

from pocketspec.torch_model.model import apply_rope, rope_angles

KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8}


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 over head_dim: values [..., head_dim] int8 and scales [..., 1] float32."""
    x_float = x.to(torch.float32)
    scales = x_float.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(x_float / scales).clamp(-127, 127).to(torch.int8), scales


def write_positions(keys: torch.Tensor, values: torch.Tensor, key_scales: torch.Tensor | None,
                    value_scales: torch.Tensor | None, positions: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """Store k and v [batch, kv_heads, T, head_dim] at positions [T] of one layer's buffers (rows from 0), by
    index_copy_; quantized where the scales are given. A plain function, so a compiled step can run it."""
    batch = k.shape[0]
    if key_scales is not None:
        (key_codes, key_scale), (value_codes, value_scale) = _quantize(k), _quantize(v)
        keys[:batch].index_copy_(2, positions, key_codes)
        key_scales[:batch].index_copy_(2, positions, key_scale)
        values[:batch].index_copy_(2, positions, value_codes)
        value_scales[:batch].index_copy_(2, positions, value_scale)
    else:
        keys[:batch].index_copy_(2, positions, k.to(keys.dtype))
        values[:batch].index_copy_(2, positions, v.to(values.dtype))


class StaticKVCache:
    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, max_context: int,
                 kv_dtype: str, device: torch.device, max_batch: int = 1,
                 layer_devices: list[torch.device] | None = None):
        """layer_devices: one device per layer (a layer split); None puts every layer on `device`."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown KV dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")
        self.max_context = max_context
        self.kv_dtype = kv_dtype
        self.is_int8 = kv_dtype == "int8"
        shape = (max_batch, num_kv_heads, max_context, head_dim)
        dtype = KV_DTYPES[kv_dtype]
        layer_devices = layer_devices if layer_devices is not None else [device] * num_layers
        if len(layer_devices) != num_layers:
            raise ValueError(f"{len(layer_devices)} layer devices for {num_layers} layers")
        self.keys = [torch.zeros(shape, dtype=dtype, device=layer_device) for layer_device in layer_devices]
        self.values = [torch.zeros(shape, dtype=dtype, device=layer_device) for layer_device in layer_devices]
        self.key_scales: list[torch.Tensor] = []
        self.value_scales: list[torch.Tensor] = []
        if self.is_int8:
            scale_shape = shape[:-1] + (1,)
            self.key_scales = [torch.zeros(scale_shape, device=layer_device) for layer_device in layer_devices]
            self.value_scales = [torch.zeros(scale_shape, device=layer_device) for layer_device in layer_devices]

    @property
    def num_bytes(self) -> int:
        return sum(self.layer_num_bytes(layer) for layer in range(len(self.keys)))

    def layer_num_bytes(self, layer: int) -> int:
        tensors = [self.keys[layer], self.values[layer]]
        if self.is_int8:
            tensors += [self.key_scales[layer], self.value_scales[layer]]
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor, first_row: int = 0) -> None:
        """Store k and v [batch, kv_heads, T, head_dim] at positions start .. start + T - 1 of rows first_row ..
        first_row + batch - 1."""
        rows, end = slice(first_row, first_row + k.shape[0]), start + k.shape[2]
        if self.is_int8:
            self.keys[layer][rows, :, start:end], self.key_scales[layer][rows, :, start:end] = _quantize(k)
            self.values[layer][rows, :, start:end], self.value_scales[layer][rows, :, start:end] = _quantize(v)
        else:
            self.keys[layer][rows, :, start:end] = k
            self.values[layer][rows, :, start:end] = v

    def write_at(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k and v [batch, kv_heads, T, head_dim] at positions [T], a tensor on the cache's device
        (index_copy_: the host never reads where; the static decode step, torch_model/static_step.py)."""
        write_positions(*self.layer_buffers(layer), positions, k, v)

    def layer_buffers(self, layer: int) -> tuple[torch.Tensor | None, ...]:
        """(keys, values, key scales, value scales) of one layer; the scales None unless int8."""
        if self.is_int8:
            return self.keys[layer], self.values[layer], self.key_scales[layer], self.value_scales[layer]
        return self.keys[layer], self.values[layer], None, None

    def read(self, layer: int, end: int, dtype: torch.dtype, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at positions 0 .. end - 1, [batch, kv_heads, end, head_dim] in `dtype`."""
        return self.read_rows(layer, slice(0, batch), end, dtype)

    def write_tokens(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> None:
        """Store k and v [num_tokens, kv_heads, head_dim] of tokens at (rows[i], positions[i]) (batched decoding)."""
        if self.is_int8:
            self.keys[layer][rows, :, positions], self.key_scales[layer][rows, :, positions] = _quantize(k)
            self.values[layer][rows, :, positions], self.value_scales[layer][rows, :, positions] = _quantize(v)
        else:
            self.keys[layer][rows, :, positions] = k.to(self.keys[layer].dtype)
            self.values[layer][rows, :, positions] = v.to(self.values[layer].dtype)

    def read_rows(self, layer: int, rows: torch.Tensor | slice, end: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the given rows at positions 0 .. end - 1, [len(rows), kv_heads, end, head_dim]."""
        keys, values = self.keys[layer][rows, :, :end], self.values[layer][rows, :, :end]
        if not self.is_int8:
            return keys.to(dtype), values.to(dtype)
        # int8 times scales already in `dtype` promotes to `dtype` in one pass: the context is
        # dequantized once, with no float32 copy on the way
        return (keys * self.key_scales[layer][rows, :, :end].to(dtype),
                values * self.value_scales[layer][rows, :, :end].to(dtype))

    def gather(self, layer: int, positions: torch.Tensor, row: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `row` at positions [kv_heads, n] (each head its own), [1, kv_heads, n, head_dim]
        in float32 (an attended-keys draft view, pocketspec/torch_model/attended_keys.py)."""
        index = positions[None, :, :, None]
        head_dim, rows = self.keys[layer].shape[-1], slice(row, row + 1)
        keys = self.keys[layer][rows].gather(2, index.expand(-1, -1, -1, head_dim)).to(torch.float32)
        values = self.values[layer][rows].gather(2, index.expand(-1, -1, -1, head_dim)).to(torch.float32)
        if self.is_int8:
            keys = keys * self.key_scales[layer][rows].gather(2, index)
            values = values * self.value_scales[layer][rows].gather(2, index)
        return keys, values

    def shift(self, start: int, count: int, num_cached: int, inv_freq: torch.Tensor,
              rows: slice = slice(None)) -> None:
        """Drop positions start .. start + count - 1 of `rows` (every row: a single sequence's cache; one
        row: a batch's) and move the later ones down by `count`.

        The moved keys were rotated for their old positions; rotating them by -count
        gives exactly the keys of their new positions (up to float rounding).
        """
        source, target = slice(start + count, num_cached), slice(start, num_cached - count)
        num_moved = num_cached - start - count
        if num_moved <= 0:
            return
        angles = {}  # per device: the layers of a layer split may sit on several
        for layer in range(len(self.keys)):
            device = self.keys[layer].device
            if device not in angles:
                angles[device] = rope_angles(torch.full((num_moved,), -count, device=device), inv_freq.to(device))
            cos, sin = angles[device]
            if self.is_int8:
                moved = (self.keys[layer][rows, :, source].to(torch.float32)
                         * self.key_scales[layer][rows, :, source])
                self.keys[layer][rows, :, target], self.key_scales[layer][rows, :, target] = _quantize(
                    apply_rope(moved, cos, sin))
                self.values[layer][rows, :, target] = self.values[layer][rows, :, source].clone()
                self.value_scales[layer][rows, :, target] = self.value_scales[layer][rows, :, source].clone()
            else:
                self.keys[layer][rows, :, target] = apply_rope(self.keys[layer][rows, :, source], cos, sin)
                self.values[layer][rows, :, target] = self.values[layer][rows, :, source].clone()
