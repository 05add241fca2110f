"""The static KV cache's int8 variant: reading dequantizes the context once, straight to the compute dtype."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pocketspec.torch_model.kv_cache import StaticKVCache

NUM_KV_HEADS, HEAD_DIM, CONTEXT = 2, 16, 40


class _FullSizeOutputs(TorchDispatchMode):
    """The dtype of every floating tensor an aten op returns with at least `numel` elements."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.dtypes = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() >= self.numel:
            self.dtypes.append(out.dtype)
        return out


def _filled_cache(kv_dtype: str) -> tuple[StaticKVCache, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    cache = StaticKVCache(num_layers=1, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, max_context=64,
                          kv_dtype=kv_dtype, device=torch.device("cpu"), max_batch=2)
    keys, values = (torch.randn(2, NUM_KV_HEADS, CONTEXT, HEAD_DIM, generator=generator) for _ in range(2))
    cache.write(0, 0, keys, values)
    return cache, keys, values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_read_dequantizes_once_into_the_compute_dtype(dtype):
    cache, _, _ = _filled_cache("int8")
    with _FullSizeOutputs(2 * NUM_KV_HEADS * CONTEXT * HEAD_DIM) as outputs:
        keys, values = cache.read(0, CONTEXT, dtype, batch=2)
    assert keys.dtype == values.dtype == dtype
    assert outputs.dtypes == [dtype, dtype]  # one full-size tensor each for keys and values, no float32 on the way
    with _FullSizeOutputs(NUM_KV_HEADS * CONTEXT * HEAD_DIM) as outputs:
        cache.read_rows(0, torch.tensor([1]), CONTEXT, dtype)
    assert outputs.dtypes == [dtype, dtype]


def test_int8_read_equals_codes_times_scales():
    cache, keys, values = _filled_cache("int8")
    got_keys, got_values = cache.read(0, CONTEXT, torch.float32, batch=2)
    # float32: bit for bit the product of the stored codes and float32 scales
    assert torch.equal(got_keys, cache.keys[0][:2, :, :CONTEXT].float() * cache.key_scales[0][:2, :, :CONTEXT])
    assert torch.equal(got_values, cache.values[0][:2, :, :CONTEXT].float() * cache.value_scales[0][:2, :, :CONTEXT])
    for got, original in ((got_keys, keys), (got_values, values)):
        assert (got - original).abs().max() <= original.abs().amax(dim=-1, keepdim=True).max() / 127
    half_keys, _ = cache.read(0, CONTEXT, torch.bfloat16, batch=2)
    assert torch.allclose(half_keys.float(), got_keys, rtol=1e-2, atol=1e-2)


def test_float_caches_read_in_the_compute_dtype():
    cache, keys, _ = _filled_cache("fp32")
    got, _ = cache.read(0, CONTEXT, torch.bfloat16, batch=2)
    assert got.dtype == torch.bfloat16 and torch.equal(got, keys.to(torch.bfloat16))
