"""Tensor parallelism as surgery on the torch model, gpt-fast style: each rank keeps a slice of
every block's attention heads and feed-forward columns, and the two projections back to the
model's width (attention's wo, the feed-forward's w_down) all-reduce their partial sums.

Heads are split by key/value group, so grouped-query attention stays whole on each rank; when
the groups or the feed-forward columns do not divide evenly, the first ranks take one more.
Embeddings, norms and the output head stay whole on every rank. The surgery runs on the meta
model before loading (resize) and on each tensor as it is read (cut), so a rank never holds
more than its slice; model.py is not touched: the slices are ordinary, narrower linears, and
the all-reduce is a forward hook.

Float formats and int4 (whose groups run along the input, cut at group boundaries) hold the
same weights as on one device; int8 takes each output row's scale over the rank's slice of
wo and w_down, so an int8 row split quantizes those two slightly differently. The all-reduce
adds the ranks' partial sums in another order than one device would (fp32 logits differ by
about 1e-5 relative on SmolLM2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from memplanner.split import even_layer_counts
from pocketspec.errors import UserError
from pocketspec.torch_model.model import ModelConfig, Transformer
from pocketspec.torch_model.quantize import Int4Linear, Int8Linear

ROW_SLICED = {"wq": "q", "wk": "kv", "wv": "kv", "w_gate": "ffn", "w_up": "ffn"}  # output rows (and bias)
COLUMN_SLICED = {"wo": "q", "w_down": "ffn"}  # input columns; their outputs are all-reduced


def shard_bounds(num_units: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of this rank's units, as even as possible, the first ranks taking one more."""
    counts = even_layer_counts(num_units, world_size)
    start = sum(counts[:rank])
    return start, start + counts[rank]


@dataclass(frozen=True)
class TensorShard:
    """Rank `rank` of `world_size`: which heads and feed-forward columns of `config` it keeps."""

    config: ModelConfig
    rank: int
    world_size: int

    def __post_init__(self):
        if self.config.num_kv_heads < self.world_size:
            raise UserError(f"a row split over {self.world_size} devices needs at least that many key/value "
                            f"heads; this model has {self.config.num_kv_heads}: use fewer devices or "
                            "--split-mode layer")

    def bounds(self, unit: str) -> tuple[int, int]:
        """Row or column range of a `q`, `kv` or `ffn` slice in the full tensors."""
        config = self.config
        if unit == "ffn":
            return shard_bounds(config.ffn_dim, self.world_size, self.rank)
        first_group, end_group = shard_bounds(config.num_kv_heads, self.world_size, self.rank)
        heads_per_group = config.num_heads // config.num_kv_heads if unit == "q" else 1
        return first_group * heads_per_group * config.head_dim, end_group * heads_per_group * config.head_dim

    @property
    def local_config(self) -> ModelConfig:
        """The config this rank's model has: its own head and column counts."""
        q_start, q_end = self.bounds("q")
        kv_start, kv_end = self.bounds("kv")
        ffn_start, ffn_end = self.bounds("ffn")
        head_dim = self.config.head_dim
        return replace(self.config, num_heads=(q_end - q_start) // head_dim,
                       num_kv_heads=(kv_end - kv_start) // head_dim, ffn_dim=ffn_end - ffn_start)

    def resize(self, model: Transformer) -> None:
        """Swap every sliced linear for a narrower one of its kind (on the meta device, before loading)."""
        local = self.local_config
        for block in model.layers:
            for parent in (block.attention, block.feed_forward):
                for name, linear in list(parent.named_children()):
                    if name in ROW_SLICED:
                        start, end = self.bounds(ROW_SLICED[name])
                        setattr(parent, name, _narrower(linear, linear.in_features, end - start))
                    elif name in COLUMN_SLICED:
                        start, end = self.bounds(COLUMN_SLICED[name])
                        setattr(parent, name, _narrower(linear, end - start, linear.out_features))
            block.attention.num_heads, block.attention.num_kv_heads = local.num_heads, local.num_kv_heads
        model.config = local

    def cut(self, name: str, tensor):
        """This rank's slice of a tensor as read from the file (numpy or torch), contiguous."""
        parts = name.split(".")
        if parts[0] != "layers" or parts[-2] not in {**ROW_SLICED, **COLUMN_SLICED}:
            return tensor
        if parts[-2] in ROW_SLICED:
            start, end = self.bounds(ROW_SLICED[parts[-2]])
            piece = tensor[start:end]
        else:
            start, end = self.bounds(COLUMN_SLICED[parts[-2]])
            piece = tensor[:, start:end]
        return np.ascontiguousarray(piece) if isinstance(piece, np.ndarray) else piece.contiguous()


def _narrower(linear: nn.Module, in_features: int, out_features: int) -> nn.Module:
    has_bias = linear.bias is not None
    if isinstance(linear, Int8Linear):
        return Int8Linear(in_features, out_features, has_bias, linear.compute_dtype)
    if isinstance(linear, Int4Linear):
        try:
            return Int4Linear(in_features, out_features, has_bias, linear.compute_dtype, linear.group_size)
        except ValueError as error:
            raise UserError(f"--weights int4 cannot be split by rows here: {error}; use --weights int8") from None
    return nn.Linear(in_features, out_features, bias=has_bias)


def _all_reduce_output(group):
    def hook(module, args, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output, group=group)  # the partial sums of every rank's columns
        return output

    return hook


def install_all_reduce(model: Transformer, group=None) -> None:
    for block in model.layers:
        block.attention.wo.register_forward_hook(_all_reduce_output(group))
        block.feed_forward.w_down.register_forward_hook(_all_reduce_output(group))
