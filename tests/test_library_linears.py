"""pocketspec/torch_model/library_linears.py on the CPU: torchao's int8 weight-only tensors take the int8
linears' place (fused projections' too) and give their logits; our int4 weights read back through their
kernel and converted to GemLite's codes, scales and zeros give the same weight (GemLite's kernels
themselves need CUDA: the GPU suite's compiled-gemlite step runs them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pocketspec.torch_model.fused_projections import fuse_projections
from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.model import ModelConfig
from pocketspec.torch_model.quantize import Int4Linear, Int8Linear
from pocketspec.torch_model.library_linears import gemlite_int4_parts, int4_dequantized, use_torchao_int8

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import torch_gpu_roofline as roofline  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONFIG = ModelConfig("qwen2", 2, 64, 4, 2, 16, 128, 300, 10000.0, 1e-5, has_qkv_bias=True, is_tied=False)


def _logits(model) -> torch.Tensor:
    cache = StaticKVCache(num_layers=CONFIG.num_layers, num_kv_heads=CONFIG.num_kv_heads, head_dim=CONFIG.head_dim,
                          max_context=32, kv_dtype="fp32", device=torch.device("cpu"))
    with torch.inference_mode():
        return model(torch.tensor([[1, 2, 3, 4]]), 0, cache, torch.arange(4))


def test_torchao_int8_linears_give_the_int8_linears_logits():
    torch.manual_seed(0)
    model = roofline.random_model(CONFIG, "int8", torch.device("cpu"))
    expected = _logits(model)
    fuse_projections(model)
    # per block: q/k/v and gate/up fused, wo and w_down alone; and the untied head
    assert use_torchao_int8(model) == 4 * CONFIG.num_layers + 1
    # the parts stay int8 linears (views of the fused weights), for a path that unfuses
    assert sum(isinstance(module, Int8Linear) for module in model.modules()) == 5 * CONFIG.num_layers
    got = _logits(model)
    assert (got - expected).abs().max() < 1e-2 * expected.abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_int4_weights_convert_to_gemlites_zero_point_form():
    """w = (q - 8) * scale + zero is w = (q - zero') * scale with zero' = 8 - zero / scale: the codes come
    back from the packed weight (read through the CPU kernel) unchanged, and the weight with them."""
    torch.manual_seed(0)
    weight = torch.randn(96, 128) * 0.02
    linear = Int4Linear(128, 96, bias=True, dtype=torch.float32)
    linear.load(weight)  # packed for the CPU's int4 kernel
    linear.bias.data.normal_()
    unpacked = Int4Linear(128, 96, bias=False, dtype=torch.float32)
    unpacked.materialize(torch.device("cpu"))
    unpacked.kernel = "dequantize"  # its codes stay as load_rows wrote them
    unpacked.load_rows(0, weight)
    codes, scales, zeros = gemlite_int4_parts(int4_dequantized(linear), linear.scales_and_zeros, linear.group_size)
    assert torch.equal(codes, unpacked.codes())
    rebuilt = ((codes.float().view(96, -1, linear.group_size) - zeros[..., None]) * scales[..., None]).view(96, 128)
    torch.testing.assert_close(rebuilt, unpacked.dequantized(torch.float32), rtol=0, atol=1e-6)
