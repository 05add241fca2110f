"""Well-kept libraries' weight-only kernels in place of the int8 and int4 linears: the GPU suite's
compiled-torchao and compiled-gemlite steps.

Issue 36 asks for a library's weight-only kernels on the GPU. Ours there are quant_kernels'
int8_reduction (one compiled reduction a decode row), int8_dequantized_mm (verify rows) and torch's
tinygemm for int4. Two libraries are measured against them, holding the codes the GGUF's weights
were quantized to:
- torchao's Int8WeightOnlyConfig, the same scheme as our int8 (one symmetric scale per output row;
  the scale is recomputed from the dequantized row, whose largest code is ±127). torchao's int4 on
  CUDA is tinygemm again (its tile-packed format) or needs fbgemm's, so only its int8 is measured.
- GemLite (github.com/mobiusml/gemlite): Triton GEMV and GEMM kernels for 16-, 8- and 4-bit weights,
  chosen by the number of rows (16-bit: against cuBLAS, whose one-row kernels ran the 1.5B's small
  projections at 28-43 % of the bandwidth). Its int8 takes our codes and scales as they are; its int4 computes
  w = (q - zero) * scale per group of inputs, so our (q - 8) * scale + zero becomes the zero
  8 - zero / scale (gemlite_int4_parts). It needs CUDA and triton; it is not in the `torch` extra
  (triton would come with it), so its pure-Python wheel travels to a GPU machine beside the suite.
Neither has been measured yet, so nothing uses this but the suite, where memory is not measured: the
parts of a fused projection keep their storage (views of it) beside the library's copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from pocketspec.torch_model.fused_projections import FUSED_PARTS
from pocketspec.torch_model.quantize import Int4Linear, Int8Linear


def swap_run_linears(model: nn.Module, kinds: tuple[type, ...],
                     convert: Callable[[nn.Module], nn.Module | None]) -> int:
    """Replace every linear of `kinds` that `model` runs by convert(linear), unless that is None: a fused
    projection's, not its parts (they stay as they are, views of it, for a path that unfuses); how many
    were replaced."""
    swapped = 0
    for parent in list(model.modules()):
        unused = set()
        for fused_name, parts in FUSED_PARTS.items():
            fused = getattr(parent, fused_name, None)
            if fused is not None:
                unused.update(parts)
                if isinstance(fused.linear, kinds) and (converted := convert(fused.linear)) is not None:
                    fused.linear = converted
                    swapped += 1
        for name, child in list(parent.named_children()):
            if isinstance(child, kinds) and name not in unused and (converted := convert(child)) is not None:
                setattr(parent, name, converted)
                swapped += 1
    return swapped


def _as_torchao(linear: Int8Linear) -> nn.Linear:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    with torch.device("meta"):
        plain = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    plain.weight = nn.Parameter(linear.dequantized(linear.compute_dtype), requires_grad=False)
    if linear.bias is not None:
        plain.bias = nn.Parameter(linear.bias.detach(), requires_grad=False)
    quantize_(plain, Int8WeightOnlyConfig())
    return plain


def use_torchao_int8(model: nn.Module) -> int:
    """torchao's int8 weight-only linears for every Int8Linear `model` runs; how many."""
    return swap_run_linears(model, (Int8Linear,), _as_torchao)


def int4_dequantized(linear: Int4Linear) -> torch.Tensor:
    """The weight [out, in] in the compute dtype, read back through the linear's own kernel (its codes
    are packed for that kernel by now): the identity's rows times the weight, less the bias."""
    identity = torch.eye(linear.in_features, dtype=linear.compute_dtype, device=linear.scales_and_zeros.device)
    with torch.inference_mode():
        columns = linear(identity)  # [in, out]
    if linear.bias is not None:
        columns = columns - linear.bias
    return columns.t()


def gemlite_int4_parts(weight: torch.Tensor, scales_and_zeros: torch.Tensor,
                       group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our int4 weight (dequantized [out, in], with its scales_and_zeros [groups, out, 2]) as GemLite's
    (codes [out, in] uint8 0..15, scales [out, groups], zeros [out, groups]) with w = (q - zero) * scale."""
    out_features = weight.shape[0]
    scales, zeros = scales_and_zeros.transpose(0, 1).float().unbind(-1)  # [out, groups] each
    groups = weight.float().view(out_features, -1, group_size)
    codes = torch.round((groups - zeros[..., None]) / scales[..., None] + 8).clamp(0, 15)
    return codes.to(torch.uint8).view(out_features, -1), scales, 8 - zeros / scales


def _gemlite_config() -> None:
    """GemLite ships kernel settings for some GPUs (an H100's, not an H200's): without any, the first
    call of each shape would search them. Another GPU of the same generation uses the nearest."""
    import gemlite
    from gemlite.core import GemLiteLinear

    if gemlite.core.get_default_cache_config() is None and torch.cuda.get_device_capability()[0] == 9:
        GemLiteLinear.load_config(str(Path(gemlite.__file__).parent / "configs" / "h100.json"))


def _as_gemlite(linear: nn.Linear | Int8Linear | Int4Linear) -> nn.Module | None:
    """GemLite's twin of one linear; None where its compute dtype is not one GemLite takes (bf16, fp16)."""
    from gemlite.core import GemLiteLinearTriton
    from gemlite.dtypes import TORCH_TO_DTYPE
    from gemlite.helper import A16W8_INT8, A16Wn

    dtype = linear.weight.dtype if isinstance(linear, nn.Linear) else linear.compute_dtype
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    if isinstance(linear, nn.Linear):  # 16-bit weights through its GEMV kernels, against cuBLAS's
        twin = GemLiteLinearTriton(16, group_size=None, in_features=linear.in_features,
                                   out_features=linear.out_features, input_dtype=TORCH_TO_DTYPE[dtype],
                                   output_dtype=TORCH_TO_DTYPE[dtype])
        twin.pack(linear.weight.detach(), None, None, bias=None if linear.bias is None else linear.bias.detach())
        return twin
    if isinstance(linear, Int8Linear):
        return A16W8_INT8(device=linear.weight.device, dtype=dtype).from_weights(
            linear.weight, bias=linear.bias, scales=linear.scales[:, None].to(dtype))
    codes, scales, zeros = gemlite_int4_parts(int4_dequantized(linear), linear.scales_and_zeros, linear.group_size)
    return A16Wn(device=codes.device, dtype=dtype).from_weights(codes, scales.to(dtype).contiguous(),
                                                              zeros.to(dtype).contiguous(), 4, linear.group_size,
                                                              bias=linear.bias)


def use_gemlite(model: nn.Module) -> int:
    """GemLite's linears for every linear `model` runs (16-bit, int8 and int4) in bf16 or fp16; how many."""
    _gemlite_config()
    return swap_run_linears(model, (nn.Linear, Int8Linear, Int4Linear), _as_gemlite)


def _as_gemlite_fp8(linear: nn.Linear) -> nn.Module | None:
    from gemlite.helper import A16W8_FP8

    if linear.weight.dtype not in (torch.bfloat16, torch.float16):
        return None
    return A16W8_FP8(device=linear.weight.device, dtype=linear.weight.dtype).from_weights(
        linear.weight.detach(), bias=None if linear.bias is None else linear.bias.detach())


def use_gemlite_fp8(model: nn.Module) -> int:
    """Every 16-bit linear `model` runs quantized to fp8 (e4m3, one scale per output row) and run by GemLite's
    kernels: what an fp8 weights format would decode at on a GPU with fp8 (issue 36 asks for it on Hopper).
    It changes the weights, so only the suite's speed rows read it; how many linears."""
    _gemlite_config()
    return swap_run_linears(model, (nn.Linear,), _as_gemlite_fp8)
