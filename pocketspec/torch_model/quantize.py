"""Weight-only int8 and int4 linears, swapped in before loading so model.py stays clean.

int8: one scale per output channel (symmetric), w = q * scale.
int4: groups of INT4_GROUP_SIZE inputs per output channel (asymmetric), two values per
byte, w = q * scale + offset with one scale and one offset per group.
Scales and offsets are kept in the compute dtype; the matmul dequantizes the weight
on the fly. Embeddings, norms and biases stay in the compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memplanner.torch_sizes import INT4_GROUP_SIZE

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Int8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(out_features, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

    def materialize(self, device: torch.device) -> None:
        """Allocate the buffers on `device` (they were built on meta), to be filled by load_rows."""
        self.weight = torch.empty(self.weight.shape, dtype=torch.int8, device=device)
        self.scales = torch.empty(self.scales.shape, dtype=self.scales.dtype, device=device)

    def load_rows(self, start: int, rows: torch.Tensor) -> None:
        """Quantize float output rows [n, in] into rows start .. start + n - 1 (one scale per row)."""
        rows = rows.to(torch.float32)
        scales = rows.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        end = start + rows.shape[0]
        self.weight[start:end] = torch.round(rows / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.scales[start:end] = scales.to(self.scales.dtype)

    def load(self, weight: torch.Tensor) -> None:
        """Quantize a whole float weight [out, in]."""
        self.materialize(weight.device)
        self.load_rows(0, weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight.to(x.dtype)) * self.scales
        return out if self.bias is None else out + self.bias


class Int4Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 group_size: int = INT4_GROUP_SIZE):
        super().__init__()
        if in_features % group_size or group_size % 2:
            raise ValueError(f"int4 needs in_features ({in_features}) divisible by an even group size ({group_size})")
        self.group_size = group_size
        self.in_features, self.out_features = in_features, out_features
        num_groups = in_features // group_size
        self.register_buffer("weight", torch.empty(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(out_features, num_groups, dtype=dtype))
        self.register_buffer("offsets", torch.empty(out_features, num_groups, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

    def materialize(self, device: torch.device) -> None:
        """Allocate the buffers on `device` (they were built on meta), to be filled by load_rows."""
        self.weight = torch.empty(self.weight.shape, dtype=torch.uint8, device=device)
        self.scales = torch.empty(self.scales.shape, dtype=self.scales.dtype, device=device)
        self.offsets = torch.empty(self.offsets.shape, dtype=self.offsets.dtype, device=device)

    def load_rows(self, start: int, rows: torch.Tensor) -> None:
        """Quantize float output rows [n, in] into rows start .. start + n - 1 (groups lie within a row)."""
        num_rows, in_features = rows.shape
        groups = rows.to(torch.float32).view(num_rows, -1, self.group_size)  # [n, num_groups, group]
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scales = ((high - low) / 15.0).clamp(min=1e-8)
        codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8)
        codes = codes.view(num_rows, in_features // 2, 2)
        end = start + num_rows
        self.weight[start:end] = codes[..., 0] | (codes[..., 1] << 4)
        self.scales[start:end], self.offsets[start:end] = scales.to(self.scales.dtype), low.to(self.offsets.dtype)

    def load(self, weight: torch.Tensor) -> None:
        """Quantize a whole float weight [out, in]."""
        self.materialize(weight.device)
        self.load_rows(0, weight)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        codes = torch.stack([self.weight & 0xF, self.weight >> 4], dim=-1).view(self.weight.shape[0], -1, self.group_size)
        weight = codes.to(dtype) * self.scales[..., None].to(dtype) + self.offsets[..., None].to(dtype)
        return weight.view(self.weight.shape[0], -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized(x.dtype), self.bias)


def swap_linears(model: nn.Module, weights_format: str, dtype: torch.dtype) -> None:
    """Replace every nn.Linear with its int8 / int4 twin (on the meta device, before loading)."""
    if weights_format not in ("int8", "int4"):
        return
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            twin = Int8Linear if weights_format == "int8" else Int4Linear
            setattr(model, name, twin(child.in_features, child.out_features, child.bias is not None, dtype))
        else:
            swap_linears(child, weights_format, dtype)
