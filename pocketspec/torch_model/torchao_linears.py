"""torchao's int8 weight-only tensors in place of the int8 linears: the GPU suite's compiled-torchao step.

Issue 36 asks for a well-kept library's weight-only kernels on the GPU. Our own int8 path there is
quant_kernels.int8_reduction (one compiled reduction a decode row) and int8_dequantized_mm (verify
rows); torchao's Int8WeightOnlyConfig is the same scheme (one symmetric int8 scale per output row),
so its tensors hold the codes the GGUF's weights were quantized to (the scale is recomputed from
the dequantized row, whose largest code is ±127). Whether its kernels beat ours has not been
measured yet, so nothing uses this but the suite, where memory is not measured: the parts of a fused
projection keep their int8 storage (views of it) beside torchao's copy. int4 stays as it is:
torchao's int4 on CUDA is the same tinygemm kernel (its tile-packed format) or needs fbgemm's.
"""

from __future__ import annotations

import torch
from torch import nn

from pocketspec.torch_model.fused_projections import FUSED_PARTS
from pocketspec.torch_model.quantize import Int8Linear


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
    """Swap every Int8Linear that `model` runs for torchao's: a fused projection's, not its parts (they
    stay as they are, views of it, for a path that unfuses); how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        unused = set()
        for fused_name, parts in FUSED_PARTS.items():
            fused = getattr(parent, fused_name, None)
            if fused is not None:
                unused.update(parts)
                if isinstance(fused.linear, Int8Linear):
                    fused.linear = _as_torchao(fused.linear)
                    swapped += 1
        for name, child in list(parent.named_children()):
            if isinstance(child, Int8Linear) and name not in unused:
                setattr(parent, name, _as_torchao(child))
                swapped += 1
    return swapped
