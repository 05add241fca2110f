"""Batch-invariant kernels: a token's result is bit-identical whatever else shares its forward.

On a CPU, MKL's sgemm rounds a row differently depending on how many rows the call
holds (one row takes a gemv path; below about 16 rows, or 57 with two threads, other
paths; measured with torch 2.13 and MKL 2024.2), and SDPA's result for a query moves
with the padded key length and the number of queries. At a near-tie, that flips a
greedy token. So, for batched decoding:

- linears, norms and the feed-forward run on tiles of a fixed number of rows
  (zero-padded): every call has one shape, so every row goes through the same code path;
- attention cuts keys into blocks fixed to absolute positions and queries into tiles
  of a fixed size, so its matmuls have fixed shapes; a fully masked block adds exact
  zeros, and the blocks are summed in order by a sequential scan (cumsum), so padding
  the key length or adding rows changes no bit.

tests/test_invariant.py checks these properties on random data in the model's shapes, on
a CPU (where cumsum is a sequential loop). On a GPU they are unverified: cuBLAS picks
kernels by batch count and CUDA reductions and scans split work by shape, so there the
attention would need kernels of its own (as in thinking-machines-lab/batch_invariant_ops).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pocketspec.torch_model.fused_projections import unfuse_projections


@dataclass
class TileShape:
    """Rows per linear call (0: all in one call); one object shared by every wrapped linear, set per forward."""

    rows: int


class RowTiled(nn.Module):
    """Runs a per-row `module` on fixed tiles of `tiles.rows` rows, zero-padding the last tile (0: in one call)."""

    def __init__(self, module: nn.Module, tiles: TileShape):
        super().__init__()
        self.module = module
        self.tiles = tiles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tiles.rows == 0:
            return self.module(x)
        rows = x.reshape(-1, x.shape[-1])
        num_rows, tile = rows.shape[0], self.tiles.rows
        num_padding = -num_rows % tile
        if num_padding:
            rows = torch.cat([rows, rows.new_zeros(num_padding, rows.shape[1])])
        out = torch.cat([self.module(chunk) for chunk in rows.split(tile)])
        return out[:num_rows].reshape(*x.shape[:-1], out.shape[-1])


class TiedHead(nn.Module):
    """The output head of a model whose head reuses the token embedding."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.embedding.weight)


def make_batch_invariant(model: nn.Module, tiles: TileShape) -> None:
    """Wrap every per-row part of `model` in a RowTiled: projections, norms, feed-forwards, the head
    (each projection alone: a GPU static step's fused ones are dropped, and RowTiled parts never fuse)."""
    unfuse_projections(model)
    for block in model.layers:
        for owner, names in ((block.attention, ("wq", "wk", "wv", "wo")),
                             (block, ("attention_norm", "ffn_norm", "feed_forward"))):
            for name in names:
                setattr(owner, name, RowTiled(getattr(owner, name), tiles))
    model.norm = RowTiled(model.norm, tiles)
    model.output = RowTiled(model.output if model.output is not None else TiedHead(model.tok_embeddings), tiles)


def blockwise_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, query_positions: torch.Tensor, *,
                        key_block: int, query_tile: int) -> torch.Tensor:
    """Causal attention whose result for a query depends only on the query and the keys it sees.

    q [batch, heads, T, head_dim] with T a multiple of query_tile; keys and values
    [batch, kv_heads, L, head_dim] with L a multiple of key_block; query t of row b sees
    keys 0 .. query_positions[b, t]. Returns [batch, heads, T, head_dim].
    """
    batch, num_heads, num_queries, head_dim = q.shape
    num_kv_heads, num_keys = keys.shape[1], keys.shape[2]
    group, num_blocks = num_heads // num_kv_heads, num_keys // key_block
    tile_rows = group * query_tile  # a query tile of every head that shares a KV head
    key_positions = torch.arange(num_keys, device=q.device)
    value_blocks = values.view(batch, num_kv_heads, num_blocks, key_block, head_dim)
    outs = []
    for first in range(0, num_queries, query_tile):
        q_tile = q[:, :, first:first + query_tile] * head_dim ** -0.5
        q_tile = q_tile.reshape(batch, num_kv_heads, tile_rows, head_dim)
        positions = query_positions[:, None, None, first:first + query_tile].expand(-1, -1, group, -1)
        scores = torch.matmul(q_tile, keys.transpose(-1, -2)).float()  # [batch, kv_heads, tile_rows, L]
        scores.masked_fill_(key_positions > positions.reshape(batch, 1, tile_rows, 1), float("-inf"))
        probs = torch.exp(scores - scores.amax(dim=-1, keepdim=True))  # a max is exact in any order
        probs = probs.view(batch, num_kv_heads, tile_rows, num_blocks, key_block)
        # per-block sums and products have fixed shapes; a sequential scan adds the blocks in
        # position order, so trailing masked blocks add exact zeros
        sums = torch.cumsum(probs.sum(dim=-1), dim=-1)[..., -1:]  # [batch, kv_heads, tile_rows, 1]
        # [batch, kv_heads, blocks, tile_rows, head_dim]
        partials = torch.matmul(probs.transpose(2, 3).to(values.dtype), value_blocks)
        out = torch.cumsum(partials.float(), dim=2)[:, :, -1] / sums
        outs.append(out.to(q.dtype).view(batch, num_heads, query_tile, head_dim))
    return torch.cat(outs, dim=2)
