"""The batch-invariant kernels on random data: a row's or a query's result is bit-identical whatever
else shares the call, where it sits, and how far the keys are padded."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pocketspec.torch_model.invariant import RowTiled, TileShape, blockwise_attention

# (in, out) of SmolLM2-135M's projections and head, and of the tiny test models
LINEAR_SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152), (64, 64), (64, 32), (128, 64)]


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def num_threads(request):
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


@pytest.mark.parametrize("tile", [4, 16])
def test_a_tiled_linear_row_never_depends_on_its_neighbours(num_threads, tile):
    generator = torch.Generator().manual_seed(0)
    for num_in, num_out in LINEAR_SHAPES:
        linear = nn.Linear(num_in, num_out, bias=num_out == 192)
        tiled = RowTiled(linear, TileShape(tile))
        rows = torch.randn(2 * tile + 1, num_in, generator=generator)
        with torch.inference_mode():
            alone = torch.cat([tiled(row[None]) for row in rows])
            for num_rows in (2, tile, len(rows)):
                order = torch.randperm(len(rows), generator=generator)[:num_rows]
                assert torch.equal(tiled(rows[order]), alone[order]), (num_in, num_out, num_rows)


def test_tile_zero_calls_the_linear_once():
    linear = nn.Linear(8, 4)
    rows = torch.randn(5, 8)
    assert torch.equal(RowTiled(linear, TileShape(0))(rows), linear(rows))


def _attention_alone(q, keys, values, position, key_block, query_tile):
    """One query at `position` in a batch of one, keys padded only to its own last block."""
    num_keys = -(-(position + 1) // key_block) * key_block
    grid = torch.zeros(1, q.shape[0], query_tile, q.shape[1])
    grid[0, :, 0] = q
    positions = torch.zeros(1, query_tile, dtype=torch.long)
    positions[0, 0] = position
    return blockwise_attention(grid, keys[None, :, :num_keys], values[None, :, :num_keys], positions,
                               key_block=key_block, query_tile=query_tile)[0, :, 0]


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(9, 3, 64), (4, 2, 16)])
@pytest.mark.parametrize("key_block, query_tile", [(128, 4), (32, 1)])
def test_blockwise_attention_of_a_query_never_depends_on_the_batch(num_threads, num_heads, num_kv_heads, head_dim,
                                                                   key_block, query_tile):
    generator = torch.Generator().manual_seed(1)
    context = 1024  # room for the last block of the latest position
    keys = torch.randn(num_kv_heads, context, head_dim, generator=generator)
    values = torch.randn(num_kv_heads, context, head_dim, generator=generator)
    for position in (5, key_block - 1, key_block, 700):
        q = torch.randn(num_heads, head_dim, generator=generator)
        alone = _attention_alone(q, keys, values, position, key_block, query_tile)
        for trial in range(3):
            batch = 1 + trial * 2
            num_slots = query_tile * (1 + trial)
            num_keys = (-(-(position + 1) // key_block) + trial) * key_block
            row, slot = trial % batch, (2 * trial + 1) % num_slots
            # other rows and slots hold other queries and keys, and stale keys lie past the position
            grid = torch.randn(batch, num_heads, num_slots, head_dim, generator=generator)
            grid[row, :, slot] = q
            batch_keys = torch.randn(batch, num_kv_heads, num_keys, head_dim, generator=generator)
            batch_values = torch.randn(batch, num_kv_heads, num_keys, head_dim, generator=generator)
            batch_keys[row, :, :position + 1] = keys[:, :position + 1]
            batch_values[row, :, :position + 1] = values[:, :position + 1]
            positions = torch.randint(0, num_keys, (batch, num_slots), generator=generator)
            positions[row, slot] = position
            out = blockwise_attention(grid, batch_keys, batch_values, positions, key_block=key_block,
                                      query_tile=query_tile)
            assert torch.equal(out[row, :, slot], alone), (position, trial)


def test_blockwise_attention_is_attention():
    """Against SDPA with the same causal mask (not bit for bit: SDPA sums in another order)."""
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 8, 16, generator=generator)
    keys, values = (torch.randn(2, 2, 64, 16, generator=generator) for _ in range(2))
    positions = torch.tensor([[40 + index for index in range(8)], [3, 4, 5, 6, 7, 8, 9, 10]])
    mask = (torch.arange(64)[None, None, :] <= positions[:, :, None])[:, None]
    expected = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    got = blockwise_attention(q, keys, values, positions, key_block=16, query_tile=4)
    assert torch.allclose(got, expected, atol=1e-5)
