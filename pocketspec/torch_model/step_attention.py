"""Attention of the static decode step on a GPU: the query heads of each key/value head folded into
rows, over the whole cache buffer ([max_context] keys, masked past each query's position).

Three ways, one result (the GPU suite compares them: benchmarks/gpu_suite.py):
- grouped_attention, two matmuls around a float32 softmax (the default);
- grouped_sdpa, the same rows through SDPA;
- flex_grouped_attention, FlexAttention (torch.nn.attention.flex_attention): one Triton kernel
  split over the keys as flash-decoding is (torch's decoding kernel, for fewer than 128 query
  rows), where a BlockMask says which blocks of keys hold anything, so blocks past the last
  position are never read and a step costs the depth, not the buffer. torch's decoding kernel
  takes grouped heads only in powers of two (Qwen2.5-1.5B has 6 a group): folded, it needs none.
  Its mask tensors are built once a step (key_blocks) and the compiled attention makes the mask
  from them and the positions it is given, so nothing recompiles from one step to the next.

Folded, row r of a key/value head is query token r % T of one of its query heads, and one kernel
program reads each key once for every head that shares it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention



def fold_query_heads(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [batch, heads, T, head_dim] as [batch, kv_heads, group x T, head_dim]: the query heads of each
    key/value head as extra rows (query head h reads key/value head h // group, repeat_interleave's order)."""
    batch, num_heads, num_tokens, head_dim = q.shape
    return q.reshape(batch, num_kv_heads, num_heads // num_kv_heads * num_tokens, head_dim)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [batch, heads, T, head_dim] over keys and values [batch, kv_heads, max_context, head_dim] where
    mask [T, max_context] allows, as two matmuls and a float32 softmax.

    Not SDPA: its kernels split the work by (head, block of queries), so a decode step of 2 to 8
    key/value heads ran on as many thread blocks, each walking the whole cache alone: 0.1 ms a layer
    on an H200 whatever the model, 4 ms a step. A matmul over the keys spreads over them instead."""
    folded = fold_query_heads(q, keys.shape[1])
    scores = torch.matmul(folded, keys.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask.repeat(folded.shape[2] // q.shape[2], 1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)
    return out.reshape(q.shape)


def grouped_sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """grouped_attention's folded query rows through SDPA (measured on an H200: 0.1 ms a layer)."""
    folded = fold_query_heads(q, keys.shape[1])
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask.repeat(folded.shape[2] // q.shape[2], 1))
    return out.reshape(q.shape)


KEY_BLOCK = 128  # keys per block of the mask (FlexAttention's default sparse block)
QUERY_ROWS = 128  # a block of queries is a multiple of this (the kernels' tile of query rows)


def key_blocks(positions: torch.Tensor, max_context: int) -> tuple[torch.Tensor, ...]:
    """For the query positions [T] (ascending) over a cache of max_context keys: the blocks every query
    sees whole (from 0), and after them the blocks some query sees in part, as BlockMask's
    (num_partial [1, 1, 1], partial [1, 1, 1, blocks], num_full [1, 1, 1], full [1, 1, 1, blocks])."""
    num_blocks = -(-max_context // KEY_BLOCK)
    blocks = torch.arange(num_blocks, dtype=torch.int32, device=positions.device)
    num_full = ((positions[0] + 1) // KEY_BLOCK).to(torch.int32)
    num_partial = (positions[-1] // KEY_BLOCK + 1).to(torch.int32) - num_full
    partial = (blocks + num_full) % num_blocks  # the partial blocks first, in order
    return (num_partial.reshape(1, 1, 1), partial.reshape(1, 1, 1, -1),
            num_full.reshape(1, 1, 1), blocks.reshape(1, 1, 1, -1))


def flex_grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                           blocks: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """q [batch, heads, T, head_dim] at `positions` [T] over keys and values [batch, kv_heads, max_context,
    head_dim]: query i sees keys 0 .. positions[i]; `blocks` from key_blocks. Returns q's shape."""
    num_tokens = q.shape[2]
    folded = fold_query_heads(q, keys.shape[1])

    def sees(batch, head, row, key):
        return key <= positions[row % num_tokens]

    num_partial, partial, num_full, full = blocks
    num_rows = folded.shape[2]
    query_block = -(-num_rows // QUERY_ROWS) * QUERY_ROWS  # one block of queries holds every row
    mask = BlockMask.from_kv_blocks(num_partial, partial, num_full, full, BLOCK_SIZE=(query_block, KEY_BLOCK),
                                    mask_mod=sees, seq_lengths=(num_rows, keys.shape[2]), compute_q_blocks=False)
    return flex_attention(folded, keys, values, block_mask=mask).reshape(q.shape)
