"""Aligning sequences of different lengths for one forward: packing, positions, per-row cache writes, masks.

The model sees the new tokens of every row packed into one sequence [1, N]: linears,
norms and the feed-forward work per token, so only attention needs the rows apart.
A BatchLayout is built once per forward. It maps each packed token to its cache row,
its absolute position (RoPE from a table indexed by position) and its slot in a padded
[rows, T] grid; `attend` writes each token's key and value at (row, position) of the
static cache, reads every row's keys up to the longest row, and attends with a
per-row causal mask. Nothing is copied on rollback: a row's length just moves back,
and whatever lies past it is masked. The seconds spent here are the realignment cost
that "Batch Speculative Decoding Done Right" measures (AlignmentTimer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from memplanner.sizes import round_up
from pocketspec.batch.forward_shape import AlignmentTimer, AttentionShape
from pocketspec.torch_model.invariant import blockwise_attention
from pocketspec.torch_model.model import masked_attention


@dataclass(frozen=True)
class RowInput:
    """New tokens for one cache row, appended after the `start` tokens it already holds."""

    row: int
    start: int
    tokens: Sequence[int]
    num_logits: int = 1  # logits for the last num_logits tokens


class BatchLayout:
    def __init__(self, items: Sequence[RowInput], *, rope: tuple[torch.Tensor, torch.Tensor], shape: AttentionShape,
                 timer: AlignmentTimer):
        started = timer.now()
        device = rope[0].device
        self.shape, self.timer = shape, timer
        lengths = [len(item.tokens) for item in items]
        self.num_rows = len(items)
        self.num_slots = round_up(max(lengths), shape.query_tile)
        self.key_length = round_up(max(item.start + length for item, length in zip(items, lengths)), shape.key_block)
        row_of, slot_of, positions, logits_at = [], [], [], []
        for index, (item, length) in enumerate(zip(items, lengths)):
            row_of += [index] * length
            slot_of += range(length)
            positions += range(item.start, item.start + length)
            logits_at += range(len(positions) - item.num_logits, len(positions))
        cache_rows = [item.row for item in items]
        tokens = [token for item in items for token in item.tokens]
        write_rows = [cache_rows[index] for index in row_of]
        (tokens, self.row_of, self.slot_of, positions, self.write_rows, cache_row_indices,
         self.logits_rows) = _to_device([tokens, row_of, slot_of, positions, write_rows, cache_rows, logits_at], device)
        self.tokens = tokens[None]  # [1, N]
        self.cos, self.sin = rope[0][positions], rope[1][positions]  # [N, head_dim / 2]
        self.write_positions = positions
        is_run = cache_rows == list(range(cache_rows[0], cache_rows[0] + len(cache_rows)))
        self.cache_rows = slice(cache_rows[0], cache_rows[-1] + 1) if is_run else cache_row_indices
        # padded slots attend to position 0 only, so no softmax row is empty
        self.query_positions = torch.zeros(self.num_rows, self.num_slots, dtype=torch.long, device=device)
        self.query_positions[self.row_of, self.slot_of] = positions
        self.mask = None
        if not shape.is_blockwise:  # [rows, 1, slots, keys]: each row sees its own past
            key_positions = torch.arange(self.key_length, device=device)
            self.mask = (key_positions <= self.query_positions[:, :, None])[:, None]
        self.logits_counts = [item.num_logits for item in items]
        timer.add("layout", started, timer.now())

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int) -> torch.Tensor:
        """Attention of the packed tokens: q [1, heads, N, head_dim], k and v [1, kv_heads, N, head_dim].

        Returns [1, heads, N, head_dim].
        """
        started = self.timer.now()
        cache.write_tokens(layer, self.write_rows, self.write_positions, k[0].transpose(0, 1), v[0].transpose(0, 1))
        keys, values = cache.read_rows(layer, self.cache_rows, self.key_length, q.dtype)
        grid = q.new_zeros(self.num_rows, self.num_slots, q.shape[1], q.shape[3])  # [rows, slots, heads, head_dim]
        grid[self.row_of, self.slot_of] = q[0].transpose(0, 1)
        grid = grid.transpose(1, 2)
        aligned = self.timer.now()
        if self.shape.is_blockwise:
            out = blockwise_attention(grid, keys, values, self.query_positions, key_block=self.shape.key_block,
                                      query_tile=self.shape.query_tile)
        else:
            out = masked_attention(grid, keys, values, self.mask, expand_groups=q.device.type != "cpu")
        attended = self.timer.now()
        packed = out.transpose(1, 2)[self.row_of, self.slot_of].transpose(0, 1)[None]
        self.timer.add("kv_and_padding", started, aligned)
        self.timer.add("kv_and_padding", attended, self.timer.now())
        return packed


def _to_device(index_lists: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Every index list of a forward in one host-to-device copy (from pinned memory, asynchronous,
    on a GPU), split into views: one copy per forward instead of one per list."""
    host = torch.tensor([value for values in index_lists for value in values], dtype=torch.long)
    if device.type == "cuda":
        host = host.pin_memory()
    return list(host.to(device, non_blocking=True).split([len(values) for values in index_lists]))
