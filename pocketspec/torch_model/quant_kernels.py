"""torch's fused weight-only kernels for the int8 / int4 linears: which one a device runs, and its packing.

The kernels read the int8 or packed int4 weight and dequantize it in registers, so a
forward reads 1 or 0.5 bytes a weight instead of materialising a float copy of it
(what the linears did before, every call). Kernel names:

- "cpu": _weight_int8pack_mm / _weight_int4pack_mm_for_cpu. On x86 they are vectorized
  for bf16 activations only (fp32 takes a scalar loop, 50-100x slower, measured with
  torch 2.13 on AVX2), so fp32 activations are cast to bf16 for the call and the result
  back; they accumulate in fp32. int4 needs an output count divisible by 16.
- "cuda-int4": _weight_int4pack_mm, the tensor-core kernel for bf16 on sm80+ (not ROCm).
- "cuda-int8": _weight_int8pack_mm where this torch has a CUDA kernel (a gemv-style
  kernel on CUDA cores): used for decode and verify rows only, see MAX_CUDA_INT8_ROWS.
- "dequantize": no fused kernel here; the linear dequantizes its weight in the call.

Where torch.compile traces an int8 linear on a GPU (the static step), neither that kernel nor
Inductor's own lowering of a dequantizing matmul is used: _weight_int8pack_mm computes in fp32
at 101 µs a matmul (an H200, 2026-11-26), and Inductor turned `F.linear(x, w.to(bf16))` into a
reduction over the transposed weight, 20 ms a qwen2.5-1.5b step (2026-11-28). Instead:
- one row (a decode step) runs as int8_reduction, one kernel that reads each int8 weight once:
  qwen2.5-1.5b at 411 tok/s, llama-3.1-8b at 129 (bf16: 474 and 158), H200, 2026-11-28;
- more rows (a verify) run as int8_dequantized_mm, opaque to Inductor: a slice of the weight
  dequantized at a time, then cuBLAS. The reduction read the weight once a row (qwen2.5-1.5b:
  3.8 ms at 2 rows, 11 ms at 8, 22 ms at 16).

Each output element is computed by one thread from its own row alone, so these kernels
are batch-invariant on the CPU as they stand (tests/test_quantize.py checks it).
"""

from __future__ import annotations

import torch

from memplanner.torch_sizes import INT8_DEQUANTIZE_SLICE_BYTES  # one home, shared with the planner
INT4_KERNEL_GROUP_SIZES = (32, 64, 128, 256)
# A prompt chunk is compute-bound: dequantizing once per call costs little beside the
# matmul, and cuBLAS's tensor cores beat the int8 gemv kernel. Decode and verify rows
# are bandwidth-bound, where reading 1 byte a weight instead of 2 + 2 + 1 pays.
MAX_CUDA_INT8_ROWS = 16
# Under torch.compile on a GPU: rows up to this run as int8_reduction, more as int8_dequantized_mm.
MAX_INT8_REDUCTION_ROWS = 1
MATERIALIZE_REDUCTION_ROWS = False  # int8_reduction's docstring says what it is for
# int32 codes unpacked at once while packing int4 (then freed): packing never holds a
# second copy of the weight.
PACK_SLICE_BYTES = 4 * 1024 * 1024
CPU_INT4_ROW_BLOCK = 64  # the CPU packing lays rows out in blocks of 64 (AVX-512) or 32 (AVX2)


def scale_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """Scales (and int4 zeros) are 2 bytes: bf16 beside fp32 compute (what the CPU kernels read)."""
    return torch.bfloat16 if compute_dtype == torch.float32 else compute_dtype


def _has_cuda_kernel(op: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA")


def int8_kernel(device: torch.device, compute_dtype: torch.dtype) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda" and _has_cuda_kernel("_weight_int8pack_mm"):
        return "cuda-int8"
    return "dequantize"


def int4_kernel(device: torch.device, compute_dtype: torch.dtype, out_features: int, in_features: int,
                group_size: int) -> str:
    if group_size not in INT4_KERNEL_GROUP_SIZES:
        return "dequantize"
    if device.type == "cpu":
        return "cpu" if out_features % 16 == 0 else "dequantize"
    is_cuda_kernel_usable = (device.type == "cuda" and not getattr(torch.version, "hip", None)
                             and torch.cuda.get_device_capability(device) >= (8, 0)
                             and compute_dtype == torch.bfloat16 and _has_cuda_kernel("_weight_int4pack_mm"))
    if is_cuda_kernel_usable and out_features % 8 == 0 and in_features % 32 == 0:
        return "cuda-int4"
    return "dequantize"


def use_fused(kernel: str, num_rows: int) -> bool:
    return kernel != "dequantize" and not (kernel == "cuda-int8" and num_rows > MAX_CUDA_INT8_ROWS)


@torch.library.custom_op("pocketspec::materialized", mutates_args=())
def materialized(x: torch.Tensor) -> torch.Tensor:
    """x copied as it is, opaque to Inductor: a kernel that reads the copy cannot recompute it."""
    return x.clone()


@materialized.register_fake
def _materialized_shape(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def int8_reduction(rows: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """rows [M, in] @ (weight [out, in] int8 * scales [out]).T as a product and a sum, for torch.compile:
    Inductor turns it into one reduction kernel that reads each int8 weight once a row and keeps the
    float weight in registers (gpt-fast's int8 decode). Eager, it would hold [M, out, in] floats.

    Inductor fuses the rows' producer (an RMSNorm, SiLU x up) into that kernel, where every output
    recomputes it: on an H200 the reductions ran at 0.8-1.8 TB/s (llama-3.1-8b, 2026-11-28).
    MATERIALIZE_REDUCTION_ROWS computes the rows once first instead (the GPU suite's
    compiled-materialized step; not yet measured, so off)."""
    if MATERIALIZE_REDUCTION_ROWS:
        rows = materialized(rows)
    products = rows.float()[:, None, :] * weight[None].float()
    return (products.sum(-1) * scales.float()).to(rows.dtype)


@torch.library.custom_op("pocketspec::int8_dequantized_mm", mutates_args=())
def int8_dequantized_mm(rows: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """rows [M, in] @ (weight [out, in] int8 * scales [out]).T -> [M, out] in rows' dtype: a slice of
    the weight at a time dequantized (INT8_DEQUANTIZE_SLICE_BYTES) and multiplied by the device's matmul."""
    slice_rows = max(1, INT8_DEQUANTIZE_SLICE_BYTES // (weight.shape[1] * rows.element_size()))
    pieces = [torch.mm(rows, weight[start:start + slice_rows].to(rows.dtype).t())
              for start in range(0, weight.shape[0], slice_rows)]
    return (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)) * scales.to(rows.dtype)


@int8_dequantized_mm.register_fake
def _int8_dequantized_mm_shape(rows: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return rows.new_empty((rows.shape[0], weight.shape[0]))


def int8_matmul(rows: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """rows [M, in] @ (weight [out, in] int8 * scales [out]).T -> [M, out] in rows' dtype."""
    return torch._weight_int8pack_mm(rows.to(scales.dtype).contiguous(), weight, scales).to(rows.dtype)


def int4_matmul(rows: torch.Tensor, weight: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
                kernel: str) -> torch.Tensor:
    """rows [M, in] against a packed int4 weight -> [M, out] in rows' dtype (scales_and_zeros may be a fused
    projection's share, not contiguous: fused_projections.py)."""
    scales_and_zeros = scales_and_zeros.contiguous()
    if kernel == "cpu":
        out = torch._weight_int4pack_mm_for_cpu(rows.to(scales_and_zeros.dtype).contiguous(), weight, group_size,
                                                scales_and_zeros)
        return out.to(rows.dtype)
    return torch._weight_int4pack_mm(rows.contiguous(), weight, group_size, scales_and_zeros)


def _inner_k_tiles(in_features: int) -> int:
    """The CUDA layout's tiles along the input: 2, 4 or 8, with in_features divisible by 16 x tiles."""
    return next(tiles for tiles in (8, 4, 2) if in_features % (16 * tiles) == 0)


def pack_int4(weight: torch.Tensor, kernel: str) -> torch.Tensor:
    """Codes [out, in / 2] (even input in the low nibble) laid out for `kernel`, in place, a slice at a time.

    Both layouts keep a block of rows in the same bytes as the block's codes (the CPU's
    blocks of 32 or 64 rows, CUDA's of 8), so slices of whole blocks pack independently.
    """
    num_rows, half_in = weight.shape
    in_features = 2 * half_in
    slice_rows = max(CPU_INT4_ROW_BLOCK, PACK_SLICE_BYTES // (4 * in_features) // CPU_INT4_ROW_BLOCK
                     * CPU_INT4_ROW_BLOCK)
    for start in range(0, num_rows, slice_rows):
        codes = weight[start:start + slice_rows]
        if kernel == "cpu":
            unpacked = torch.stack([codes & 0xF, codes >> 4], dim=-1).view(len(codes), in_features).to(torch.int32)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpacked, 2)
        else:  # CUDA's packing reads the even input from the high nibble (torch >= 2.5)
            packed = torch.ops.aten._convert_weight_to_int4pack((codes << 4) | (codes >> 4),
                                                                _inner_k_tiles(in_features))
        weight[start:start + slice_rows] = packed.contiguous().view(torch.uint8).view(len(codes), half_in)
    if kernel == "cpu":
        return weight
    tiles = _inner_k_tiles(in_features)
    return weight.view(torch.int32).view(num_rows // 8, in_features // (16 * tiles), 32, tiles // 2)
