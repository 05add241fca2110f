"""Tensor-parallel surgery, in one process: the shards cover every head and column once, and the
partial outputs of the shards' attention and feed-forward sum to the whole model's outputs
(what the all-reduce computes), with grouped-query heads split unevenly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pocketspec.errors import UserError
from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.load import load_model
from pocketspec.torch_model.model import ModelConfig, rope_angles
from pocketspec.torch_model.tensor_parallel import TensorShard, shard_bounds
from tiny_models import tiny_weights, tiny_vocabulary, write_tiny_model

SHAPE = dict(dim=96, num_layers=1, num_heads=6, num_kv_heads=3, ffn_dim=130)  # 3 KV groups over 2 ranks: 2 + 1
CONFIG = ModelConfig("llama", num_layers=2, dim=96, num_heads=6, num_kv_heads=3, head_dim=16, ffn_dim=130,
                     vocab_size=100)


@pytest.fixture(scope="module")
def qwen2_f32(tmp_path_factory):
    """A one-block qwen2 model (q/k/v biases), F32, whose heads and columns split unevenly over 2 ranks."""
    tensors = tiny_weights(np.random.default_rng(3), len(tiny_vocabulary()[0]), has_qkv_bias=True, **SHAPE)
    return write_tiny_model(tmp_path_factory.mktemp("tp") / "uneven.gguf", tensors, arch="qwen2", quant=None,
                            **SHAPE)


@pytest.mark.parametrize("num_units, world_size", [(3, 2), (130, 2), (8, 8), (49152, 3)])
def test_shards_cover_every_unit_once_and_evenly(num_units, world_size):
    bounds = [shard_bounds(num_units, world_size, rank) for rank in range(world_size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == num_units
    assert all(end == next_start for (_, end), (next_start, _) in zip(bounds, bounds[1:]))
    assert max(end - start for start, end in bounds) - min(end - start for start, end in bounds) <= 1


def test_local_configs_add_up_and_keep_query_groups_whole():
    shards = [TensorShard(CONFIG, rank, 2).local_config for rank in range(2)]
    assert [(c.num_heads, c.num_kv_heads, c.ffn_dim) for c in shards] == [(4, 2, 65), (2, 1, 65)]
    assert TensorShard(CONFIG, 1, 2).bounds("q") == (64, 96) and TensorShard(CONFIG, 1, 2).bounds("kv") == (32, 48)


def test_more_ranks_than_kv_heads_is_refused():
    with pytest.raises(UserError, match="at least that many key/value heads"):
        TensorShard(CONFIG, 0, 4)


def _partial_outputs(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block 0's attention and feed-forward outputs (before any all-reduce) for hidden states x [1, T, dim]."""
    config = model.config
    cache = StaticKVCache(num_layers=1, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim, max_context=32,
                          kv_dtype="fp32", device=torch.device("cpu"))
    cos, sin = rope_angles(torch.arange(x.shape[1]), model.inv_freq)
    block = model.layers[0]
    attention = block.attention
    return attention.output(attention.attend(*attention.project(x, cos, sin), cache, 0, 0)), block.feed_forward(x)


@torch.inference_mode()
def test_shard_outputs_sum_to_the_whole_model(qwen2_f32):
    cpu = torch.device("cpu")
    whole = load_model(qwen2_f32, "fp32", cpu)
    shards = [load_model(qwen2_f32, "fp32", cpu, shard=TensorShard(whole.config, rank, 2)) for rank in range(2)]
    assert shards[1].layers[0].attention.wq.weight.shape == (32, 96)  # 1 KV group = 2 query heads of 16
    assert shards[0].layers[0].feed_forward.w_down.weight.shape == (96, 65)
    x = torch.randn(1, 7, 96, generator=torch.Generator().manual_seed(0))
    attention, feed_forward = _partial_outputs(whole, x)
    partials = [_partial_outputs(shard, x) for shard in shards]
    torch.testing.assert_close(partials[0][0] + partials[1][0], attention, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(partials[0][1] + partials[1][1], feed_forward, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(partials[0][0], attention, atol=1e-3)  # each rank alone holds only part of it
