"""Weight-only int8 and int4 linears, swapped in before loading so model.py stays clean.

int8: one scale per output channel (symmetric), w = q * scale.
int4: groups of INT4_GROUP_SIZE inputs per output channel (asymmetric), two codes a byte,
w = (q - 8) * scale + zero with one scale and one zero per group, stored together as
`scales_and_zeros` [num_groups, out, 2], the layout torch's int4 kernels read.
Scales and zeros are 2-byte floats (quant_kernels.scale_dtype). The matmul runs in one of
torch's fused weight-only kernels where the device has one (quant_kernels.py), which read
the packed weight without ever materialising it; elsewhere it dequantizes the weight in
the call. Embeddings, norms and biases stay in the compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memplanner.torch_sizes import INT4_GROUP_SIZE
from pocketspec.torch_model import quant_kernels

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Int8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        """dtype: the compute dtype (activations and bias)."""
        super().__init__()
        self.in_features, self.out_features, self.compute_dtype = in_features, out_features, dtype
        self.kernel = "dequantize"  # chosen by materialize, for the device
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(out_features, dtype=quant_kernels.scale_dtype(dtype)))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

    def materialize(self, device: torch.device) -> None:
        """Allocate the buffers on `device` (they were built on meta), to be filled by load_rows."""
        self.kernel = quant_kernels.int8_kernel(device, self.compute_dtype)
        self.weight = torch.empty(self.weight.shape, dtype=torch.int8, device=device)
        self.scales = torch.empty(self.scales.shape, dtype=quant_kernels.scale_dtype(self.compute_dtype),
                                  device=device)

    def load_rows(self, start: int, rows: torch.Tensor) -> None:
        """Quantize float output rows [n, in] into rows start .. start + n - 1 (one scale per row)."""
        rows = rows.to(torch.float32)
        # codes are taken against the stored (rounded) scale, so rounding it costs no accuracy
        scales = (rows.abs().amax(dim=1).clamp(min=1e-8) / 127.0).to(self.scales.dtype)
        end = start + rows.shape[0]
        self.weight[start:end] = torch.round(rows / scales[:, None].float()).clamp(-127, 127).to(torch.int8)
        self.scales[start:end] = scales

    def pack(self) -> None:
        """After the last load_rows: the fused kernels read this layout as it is."""

    def load(self, weight: torch.Tensor) -> None:
        """Quantize a whole float weight [out, in]."""
        self.materialize(weight.device)
        self.load_rows(0, weight)
        self.pack()

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight.to(dtype) * self.scales[:, None].to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.kernel == "cuda-int8" and torch.compiler.is_compiling():  # quant_kernels says why
            matmul = (quant_kernels.int8_reduction if rows.shape[0] <= quant_kernels.MAX_INT8_REDUCTION_ROWS
                      else quant_kernels.int8_dequantized_mm)
            out = matmul(rows, self.weight, self.scales).view(*x.shape[:-1], -1)
        elif quant_kernels.use_fused(self.kernel, rows.shape[0]):
            out = quant_kernels.int8_matmul(rows, self.weight, self.scales).view(*x.shape[:-1], -1)
        else:
            out = F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        return out if self.bias is None else out + self.bias


class Int4Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 group_size: int = INT4_GROUP_SIZE):
        """dtype: the compute dtype (activations and bias)."""
        super().__init__()
        if in_features % group_size or group_size % 2:
            raise ValueError(f"int4 needs in_features ({in_features}) divisible by an even group size ({group_size})")
        self.group_size, self.compute_dtype = group_size, dtype
        self.in_features, self.out_features = in_features, out_features
        self.kernel = "dequantize"  # chosen by materialize, for the device and shape
        num_groups = in_features // group_size
        # codes [out, in / 2], two a byte (even input in the low nibble) until pack() lays them out for the kernel
        self.register_buffer("weight", torch.empty(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales_and_zeros",
                             torch.empty(num_groups, out_features, 2, dtype=quant_kernels.scale_dtype(dtype)))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

    def materialize(self, device: torch.device) -> None:
        """Allocate the buffers on `device` (they were built on meta), to be filled by load_rows."""
        self.kernel = quant_kernels.int4_kernel(device, self.compute_dtype, self.out_features, self.in_features,
                                                self.group_size)
        self.weight = torch.empty(self.weight.shape, dtype=torch.uint8, device=device)
        self.scales_and_zeros = torch.empty(self.scales_and_zeros.shape,
                                            dtype=quant_kernels.scale_dtype(self.compute_dtype), device=device)

    def load_rows(self, start: int, rows: torch.Tensor) -> None:
        """Quantize float output rows [n, in] into rows start .. start + n - 1 (groups lie within a row)."""
        num_rows, in_features = rows.shape
        groups = rows.to(torch.float32).view(num_rows, -1, self.group_size)  # [n, num_groups, group]
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        dtype = self.scales_and_zeros.dtype
        scales = ((high - low) / 15.0).clamp(min=1e-8).to(dtype)
        zeros = (low + 8 * scales.float()).to(dtype)  # code 8 is the zero point
        codes = torch.round((groups - zeros.float()[..., None]) / scales.float()[..., None] + 8).clamp(0, 15)
        codes = codes.to(torch.uint8).view(num_rows, in_features // 2, 2)
        end = start + num_rows
        self.weight[start:end] = codes[..., 0] | (codes[..., 1] << 4)
        self.scales_and_zeros[:, start:end] = torch.stack([scales, zeros], dim=-1).transpose(0, 1)

    def codes(self) -> torch.Tensor:
        """The codes [out, in] as uint8 0 .. 15 (before pack)."""
        return torch.stack([self.weight & 0xF, self.weight >> 4], dim=-1).view(self.out_features, self.in_features)

    def pack(self) -> None:
        """After the last load_rows: lay the codes out for the fused kernel, in place."""
        if self.kernel != "dequantize":
            self.weight = quant_kernels.pack_int4(self.weight, self.kernel)

    def load(self, weight: torch.Tensor) -> None:
        """Quantize a whole float weight [out, in]."""
        self.materialize(weight.device)
        self.load_rows(0, weight)
        self.pack()

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] in `dtype` (before pack)."""
        codes = self.codes().view(self.out_features, -1, self.group_size).to(dtype) - 8
        scales, zeros = self.scales_and_zeros.transpose(0, 1).to(dtype).unbind(-1)  # [out, num_groups] each
        return (codes * scales[..., None] + zeros[..., None]).view(self.out_features, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if quant_kernels.use_fused(self.kernel, rows.shape[0]):
            out = quant_kernels.int4_matmul(rows, self.weight, self.scales_and_zeros, self.group_size, self.kernel)
            out = out.view(*x.shape[:-1], -1)
            return out if self.bias is None else out + self.bias
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
