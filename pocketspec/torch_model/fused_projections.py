"""Linears that read the same input, run as one matmul on a GPU: q, k and v; gate and up.

A decode step on a GPU is a chain of small kernels, and at batch 1 each matmul is over before
the GPU is full: the qwen2.5-1.5b step spent 4 ms on its graph's kernels where its weights
take 0.7 ms to read (H200, 2026-11-27). Three projections of one input as one matmul read the
same bytes in one kernel instead of three, and gate and up likewise in one instead of two.

`fuse_projections` concatenates each group's weights into one tensor, and each part's weight
becomes a view of its rows: memory holds every weight once, and every other path (the dynamic
forward, tensor-parallel slicing, the loaders' names) still sees wq, wk, wv, w_gate and w_up.
A FusedProjection is a plain object, not a module, so a model's parameters count each byte
once. It fuses plain float linears, int8 linears (their per-row scales concatenate the same way)
and int4 linears whose parts have whole blocks of INT4_FUSED_ROW_BLOCK output rows: every int4
layout keeps a block of rows apart from the others (quant_kernels.pack_int4 relies on it too), so
the packed weights concatenate by rows; their scales and zeros [groups, out, 2] concatenate along
`out`, where a part's share is no longer contiguous (int4_matmul copies it when a part runs alone).
"""

from __future__ import annotations

import torch
from torch import nn

from pocketspec.torch_model.model import FeedForward
from pocketspec.torch_model.quantize import Int4Linear, Int8Linear

# int4 parts fuse when their output rows fill whole blocks of the packed layouts: CUDA's 8 rows,
# the CPU's 32 or 64 (quant_kernels.CPU_INT4_ROW_BLOCK)
INT4_FUSED_ROW_BLOCK = 64
# each fused projection's attribute (on Attention or FeedForward) and the parts it runs as one
FUSED_PARTS = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
# where each fused tensor's parts lie: the dimension of the output rows (int4's packed CUDA weight holds
# 8 rows per index of its first dimension, so a part's share is counted in that tensor's own rows)
OUTPUT_DIMS = {"weight": 0, "bias": 0, "scales": 0, "scales_and_zeros": 1}


class FusedProjection:
    """Several linears of one input as one: calling it returns their outputs, in order."""

    def __init__(self, linear: nn.Module, sizes: list[int]):
        self.linear, self.sizes = linear, sizes

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(x).split(self.sizes, dim=-1)


def _can_fuse(parts: list[nn.Module]) -> bool:
    kinds = {type(part) for part in parts}
    if len(kinds) != 1 or kinds - {nn.Linear, Int8Linear, Int4Linear}:
        return False
    first = parts[0]
    if isinstance(first, Int4Linear) and not all(part.group_size == first.group_size and part.kernel == first.kernel
                                                 and part.out_features % INT4_FUSED_ROW_BLOCK == 0 for part in parts):
        return False
    return all(part.in_features == first.in_features and (part.bias is None) == (first.bias is None)
               and part.weight.dtype == first.weight.dtype and part.weight.device == first.weight.device
               for part in parts)


def _replace(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """module.<name> becomes `tensor`, a parameter where it was one (a buffer stays a buffer)."""
    old = getattr(module, name)
    setattr(module, name, nn.Parameter(tensor, requires_grad=old.requires_grad)
            if isinstance(old, nn.Parameter) else tensor)


def _rehome(part: nn.Module, name: str, whole: torch.Tensor, start: int) -> int:
    """part.<name> becomes its share of `whole` from `start` along the output rows; where the next part's
    share starts."""
    size = getattr(part, name).shape[OUTPUT_DIMS[name]]
    _replace(part, name, whole.narrow(OUTPUT_DIMS[name], start, size))
    return start + size


def _fused(parts: list[nn.Module]) -> FusedProjection | None:
    if not _can_fuse(parts):
        return None
    first = parts[0]
    sizes = [part.out_features for part in parts]
    names = ["weight", "bias"] if first.bias is not None else ["weight"]
    if isinstance(first, Int8Linear):
        names.append("scales")
        with torch.device("meta"):
            linear = Int8Linear(first.in_features, sum(sizes), first.bias is not None, first.compute_dtype)
        linear.kernel = first.kernel
    elif isinstance(first, Int4Linear):
        names.append("scales_and_zeros")
        with torch.device("meta"):
            linear = Int4Linear(first.in_features, sum(sizes), first.bias is not None, first.compute_dtype,
                                first.group_size)
        linear.kernel = first.kernel
    else:
        with torch.device("meta"):
            linear = nn.Linear(first.in_features, sum(sizes), bias=first.bias is not None)
    with torch.no_grad():
        for name in names:
            whole = torch.cat([getattr(part, name).detach() for part in parts], dim=OUTPUT_DIMS[name])
            _replace(linear, name, whole)
            start = 0
            for part in parts:
                start = _rehome(part, name, whole, start)
    return FusedProjection(linear, sizes)


def fuse_projections(model: nn.Module) -> None:
    """Fuse each block's q/k/v and gate/up (idempotent; a group that cannot fuse stays apart).

    Fusing holds one block's groups twice at a time. The parts' old storage goes back to the
    GPU allocator's cache, which could not hand it to the larger fused tensors: it is released
    at the end, so the process holds each weight once, as the memory plan counts it."""
    has_fused = False
    for block in model.layers:
        attention, feed_forward = block.attention, block.feed_forward
        if attention.wqkv is None:
            attention.wqkv = _fused([getattr(attention, name) for name in FUSED_PARTS["wqkv"]])
            has_fused |= attention.wqkv is not None
        if isinstance(feed_forward, FeedForward) and feed_forward.w_gate_up is None:  # not row-tiled whole
            feed_forward.w_gate_up = _fused([getattr(feed_forward, name) for name in FUSED_PARTS["w_gate_up"]])
            has_fused |= feed_forward.w_gate_up is not None
    if has_fused and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def unfuse_projections(model: nn.Module) -> None:
    """Run the parts one by one again (their weights stay views of the fused tensors)."""
    for block in model.layers:
        block.attention.wqkv = None
        if isinstance(block.feed_forward, FeedForward):
            block.feed_forward.w_gate_up = None
